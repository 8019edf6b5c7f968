//! Any platform's webhooks by configuration: a [`Spec`] says where a request's signature,
//! timestamp and fields are and how it is verified; [`WebhookApp`] checks and decodes requests
//! by it, as the Feishu and WeCom crates do by their platforms' rules. [`preset`] gives the
//! specs of platforms whose rules are published (Slack, GitHub, Standard Webhooks, Telegram) and
//! of the seeds' third-party gateways (wkteam, xingyapi).
//!
//! ```
//! use oncegate_webhook::{WebhookApp, preset};
//!
//! let slack = preset("slack").expect("a preset");
//! let app = WebhookApp::new(slack, "A0123", vec!["8f742231b10e8888abcd99yyyzzz85a5".into()])
//!     .expect("a valid spec");
//! assert_eq!(oncegate_core::WebhookSource::platform(&app), "slack");
//! ```

mod presets;
mod request;
mod source;
mod spec;
mod verify;

pub use presets::{PRESETS, preset};
pub use source::WebhookApp;
pub use spec::{
    Answer, Ed25519, Encoding, Fields, Handshake, Hash, Hmac, KeyEncoding, Location, Spec,
    Template, Time, TimeUnit, Verify,
};

/// Why a spec cannot be used: said with the setting's text and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A location that is not `header:…`, `query:…` or a JSON pointer.
    #[error("{text:?} is not a place in a request: {reason}")]
    Location {
        /// The text.
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// A signed template with an unknown placeholder.
    #[error("signed = {template:?}: {reason}")]
    Template {
        /// The template.
        template: String,
        /// What is wrong.
        reason: String,
    },
    /// Settings that do not fit together.
    #[error("{0}")]
    Incoherent(String),
}

impl SpecError {
    pub(crate) fn location(text: &str, reason: &str) -> Self {
        Self::Location {
            text: text.to_owned(),
            reason: reason.to_owned(),
        }
    }
}
