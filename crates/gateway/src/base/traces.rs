//! OpenTelemetry spans: one trace per event, from the platform's callback to each delivery.
//!
//! An event's trace id is its key (the 128-bit hash every log line names as `key`), and the
//! span that admitted it has an id derived from that key: every gateway, before and after a
//! restart, puts the event's later spans into the same trace under the same root without
//! storing anything with the event. A platform's retry of a callback shows in that trace as one
//! more ingress span, answered as a duplicate. Spans are built once their end is known (with
//! their start and end times), so nothing is held across an await; with no tracer configured
//! none of this runs.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{
    Span, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};

use oncegate_core::KeyHash;

/// An event's place in its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTrace {
    /// The event's key, as a trace id.
    pub trace_id: TraceId,
    /// The span that admitted it: the parent of every later span of the event.
    pub root: SpanId,
}

impl EventTrace {
    /// The trace of the event whose key is `key`.
    pub fn of(key: &KeyHash) -> Self {
        let bytes = key.0;
        let mut root = [0u8; 8];
        root.copy_from_slice(&bytes[8..]);
        // Never the invalid all-zero id; otherwise the key's low half.
        if root == [0; 8] {
            root[7] = 1;
        }
        Self {
            trace_id: TraceId::from_bytes(bytes),
            root: SpanId::from_bytes(root),
        }
    }

    /// The root span's context, as a parent.
    fn parent(&self) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            self.root,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ))
    }

    /// The W3C `traceparent` that names `span` in this trace, for a downstream.
    pub fn traceparent(&self, span: SpanId) -> String {
        format!("00-{}-{}-01", self.trace_id, span)
    }
}

/// A new span id, for a span whose id must be known before it is recorded (a delivery names
/// it in its `traceparent`).
pub(crate) fn span_id() -> SpanId {
    // Never 0, the invalid id.
    SpanId::from_bytes(fastrand::u64(1..).to_be_bytes())
}

/// A W3C `traceparent` header's span context (version 00), if it is one.
pub fn parse_traceparent(header: &str) -> Option<SpanContext> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // The W3C grammar: lowercase hex digits, each field its exact length (a number parser
    // alone would also take a sign or fewer digits).
    let hex = |field: &str, len: usize| {
        field.len() == len
            && field
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if version != "00"
        || parts.next().is_some()
        || !hex(trace, 32)
        || !hex(span, 16)
        || !hex(flags, 2)
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

/// One finished span to record.
pub(crate) struct Finished {
    pub(crate) name: Cow<'static, str>,
    pub(crate) kind: SpanKind,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    pub(crate) attributes: Vec<KeyValue>,
    /// `Err(description)` for a failure.
    pub(crate) status: Result<(), String>,
    /// Its id, when it must be known beforehand; a new one otherwise.
    pub(crate) span_id: Option<SpanId>,
}

impl Finished {
    /// A span named `name` from `start` to `end`, no attributes, fine.
    pub(crate) fn new(
        name: impl Into<Cow<'static, str>>,
        start: SystemTime,
        end: SystemTime,
    ) -> Self {
        Self {
            name: name.into(),
            kind: SpanKind::Internal,
            start,
            end,
            attributes: Vec::new(),
            status: Ok(()),
            span_id: None,
        }
    }

    pub(crate) fn kind(mut self, kind: SpanKind) -> Self {
        self.kind = kind;
        self
    }

    pub(crate) fn with(
        mut self,
        key: &'static str,
        value: impl Into<opentelemetry::Value>,
    ) -> Self {
        self.attributes.push(KeyValue::new(key, value));
        self
    }

    pub(crate) fn failed(mut self, why: Option<String>) -> Self {
        if let Some(why) = why {
            self.status = Err(why);
        }
        self
    }

    pub(crate) fn id(mut self, id: SpanId) -> Self {
        self.span_id = Some(id);
        self
    }

    fn builder(self) -> SpanBuilder {
        let mut builder = SpanBuilder::from_name(self.name)
            .with_kind(self.kind)
            .with_start_time(self.start)
            .with_end_time(self.end)
            .with_attributes(self.attributes);
        builder.span_id = self.span_id;
        builder.status = match self.status {
            Ok(()) => Status::Unset,
            Err(why) => Status::error(why),
        };
        builder
    }
}

/// Where a gateway's spans go: the tracer configured (`[telemetry]`), or nowhere.
#[derive(Default)]
pub struct Traces {
    tracer: Option<BoxedTracer>,
    /// Events whose trace id's low 64 bits are at most this are traced.
    threshold: u64,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces")
            .field("on", &self.tracer.is_some())
            .finish()
    }
}

impl Traces {
    /// Spans of every event go to `tracer`.
    pub fn new(tracer: BoxedTracer) -> Self {
        Self {
            tracer: Some(tracer),
            threshold: u64::MAX,
        }
    }

    /// Traces only this share of the events (0 to 1), chosen by their key: every gateway
    /// traces the same events, whole. API calls that bring a `traceparent` follow its
    /// sampled flag instead.
    pub fn sampled(mut self, ratio: f64) -> Self {
        let ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self.threshold = if ratio >= 1.0 {
            u64::MAX
        } else {
            // Exact below 2^53; the share is a setting, not a count.
            (ratio * (u64::MAX as f64)) as u64
        };
        self
    }

    /// Whether spans may be recorded: checked before anything is measured for them.
    pub(crate) fn on(&self) -> bool {
        self.tracer.is_some()
    }

    /// Whether the event of `trace` is traced.
    pub(crate) fn keeps(&self, trace: &EventTrace) -> bool {
        // The root's id is the key's low half: the share is taken on it.
        self.on()
            && self.threshold > 0
            && u64::from_be_bytes(trace.root.to_bytes()) <= self.threshold
    }

    /// Records `span` in `trace`, under its root.
    pub(crate) fn child(&self, trace: &EventTrace, span: Finished) {
        if !self.keeps(trace) {
            return;
        }
        if let Some(tracer) = &self.tracer {
            let mut span = tracer.build_with_context(span.builder(), &trace.parent());
            // The builder set the end time; `end` keeps it.
            span.end();
        }
    }

    /// Records the root span of `trace`: the one that admitted the event.
    pub(crate) fn root(&self, trace: &EventTrace, span: Finished) {
        if !self.keeps(trace) {
            return;
        }
        if let Some(tracer) = &self.tracer {
            let mut builder = span.id(trace.root).builder();
            builder.trace_id = Some(trace.trace_id);
            let mut span = tracer.build_with_context(builder, &Context::new());
            // The builder set the end time; `end` keeps it.
            span.end();
        }
    }

    /// The spans of one platform callback for `event` (whose key is `key`): received at
    /// `received`, decoded and checked at `decoded`, answered now. The admission that queued
    /// the event is its trace's root; a repeat is one more ingress span in that trace.
    pub(crate) fn ingress(
        &self,
        key: &KeyHash,
        event: &oncegate_core::Event,
        received: SystemTime,
        decoded: SystemTime,
        outcome: Result<&oncegate_core::Accepted, &oncegate_core::Refusal>,
    ) {
        let trace = EventTrace::of(key);
        if !self.keeps(&trace) {
            return;
        }
        let now = SystemTime::now();
        let span = Finished::new("oncegate.ingress", received, now)
            .kind(SpanKind::Server)
            .with("oncegate.platform", event.platform.clone())
            .with("oncegate.app", event.app.clone())
            .with("oncegate.event_id", event.event_id.clone())
            .with("oncegate.event_type", event.event_type.clone());
        match outcome {
            // A spooled event is admitted when the store answers again: its root is this.
            Ok(how @ (oncegate_core::Accepted::Admitted | oncegate_core::Accepted::Spooled)) => {
                let outcome = if *how == oncegate_core::Accepted::Spooled {
                    "spooled"
                } else {
                    "admitted"
                };
                self.root(&trace, span.with("oncegate.outcome", outcome));
                self.child(&trace, Finished::new("oncegate.decode", received, decoded));
                self.child(&trace, Finished::new("oncegate.admit", decoded, now));
            }
            Ok(oncegate_core::Accepted::Duplicate) => {
                self.child(&trace, span.with("oncegate.outcome", "duplicate"));
            }
            Err(refusal) => self.child(
                &trace,
                span.with("oncegate.outcome", "refused")
                    .failed(Some(refusal.message.clone())),
            ),
        }
    }

    /// Records `span` under `parent` (a caller's `traceparent`), or as a root of its own.
    pub(crate) fn under(&self, parent: Option<SpanContext>, span: Finished) {
        let kept = match &parent {
            Some(parent) => parent.is_sampled(),
            None => fastrand::u64(..) <= self.threshold && self.threshold > 0,
        };
        if !kept {
            return;
        }
        if let Some(tracer) = &self.tracer {
            let context = match parent {
                Some(parent) => Context::new().with_remote_span_context(parent),
                None => Context::new(),
            };
            let mut span = tracer.build_with_context(span.builder(), &context);
            // The builder set the end time; `end` keeps it.
            span.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_trace_is_its_key() {
        let key = KeyHash::of(&["feishu", "cli_a", "event_id", "ev-1"]);
        let trace = EventTrace::of(&key);
        assert_eq!(trace.trace_id.to_string(), key.to_string());
        assert_eq!(EventTrace::of(&key), trace, "the same on every gateway");
        let header = trace.traceparent(SpanId::from_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(header, format!("00-{key}-0102030405060708-01"));
        let parsed = parse_traceparent(&header).expect("ours parses");
        assert_eq!(parsed.trace_id(), trace.trace_id);
        assert!(parsed.is_remote() && parsed.is_sampled());
    }

    #[test]
    fn a_share_of_events_is_traced_the_same_on_every_gateway() {
        let traces = Traces::new(opentelemetry::global::BoxedTracer::new(Box::new(
            opentelemetry::trace::noop::NoopTracer::new(),
        )))
        .sampled(0.25);
        let keys: Vec<KeyHash> = (0..4000).map(|n| KeyHash::of(&[&n.to_string()])).collect();
        let kept = keys
            .iter()
            .filter(|key| traces.keeps(&EventTrace::of(key)))
            .count();
        assert!((800..1200).contains(&kept), "about a quarter: {kept}");
        let again = Traces::new(opentelemetry::global::BoxedTracer::new(Box::new(
            opentelemetry::trace::noop::NoopTracer::new(),
        )))
        .sampled(0.25);
        assert!(
            keys.iter()
                .all(|key| traces.keeps(&EventTrace::of(key)) == again.keeps(&EventTrace::of(key))),
            "the same events on every gateway"
        );
        let none = Traces::new(opentelemetry::global::BoxedTracer::new(Box::new(
            opentelemetry::trace::noop::NoopTracer::new(),
        )))
        .sampled(0.0);
        assert!(!keys.iter().any(|key| none.keeps(&EventTrace::of(key))));
        assert!(!Traces::default().keeps(&EventTrace::of(&keys[0])), "off");
    }

    #[test]
    fn a_bad_traceparent_is_no_parent() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-zz",
            "00-0af7651916cd43dd8448eb211c80319cff-b7ad6b71692033-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            // Found by the fuzzer: a sign, a one-digit flags field.
            "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
        // The W3C specification's example.
        let example = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .expect("the spec's example");
        assert_eq!(
            example.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
    }
}
