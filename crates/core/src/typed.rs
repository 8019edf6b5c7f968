//! Typed events: a platform crate reads an event's payload into a struct of its family
//! (a Feishu message, a WeCom external-chat change), for handlers that would rather not parse
//! JSON or XML themselves. The raw payload stays on the [`Event`].

use crate::Event;

/// A struct one family of events reads into.
pub trait FromEvent: Sized {
    /// The event types (route patterns: exact, `prefix*` or `*`) this family covers.
    const EVENT_TYPES: &'static [&'static str];

    /// Reads `event`'s payload; an event of another family or platform, or a payload without
    /// the family's fields, is a [`ShapeError`].
    fn from_event(event: &Event) -> Result<Self, ShapeError>;
}

/// An event that is not of the family asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event_type} event {event_id} is not a {family}: {why}")]
pub struct ShapeError {
    /// The family asked for.
    pub family: &'static str,
    /// The event's type.
    pub event_type: String,
    /// The event's id.
    pub event_id: String,
    /// What did not fit.
    pub why: String,
}

impl ShapeError {
    /// `event` is not a `family`, because `why`.
    pub fn new(family: &'static str, event: &Event, why: impl std::fmt::Display) -> Self {
        Self {
            family,
            event_type: event.event_type.to_string(),
            event_id: event.event_id.to_string(),
            why: why.to_string(),
        }
    }
}
