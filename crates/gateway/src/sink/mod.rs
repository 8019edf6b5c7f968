//! Where handled events go: an HTTP endpoint (Standard Webhooks), a Kafka topic, JSON lines,
//! or Rust code.

pub(crate) mod configured;
mod error;
pub(crate) mod file;
#[cfg(feature = "http-sink")]
mod http;
#[cfg(feature = "kafka")]
mod kafka;
mod lines;
mod outgoing;
#[cfg(feature = "http-sink")]
mod sign;
#[cfg(feature = "http-sink")]
pub(crate) mod stream;

pub use error::{SinkError, SinkSetupError};
#[cfg(feature = "http-sink")]
pub use http::HttpSink;
#[cfg(feature = "kafka")]
pub use kafka::KafkaSink;
pub use lines::LinesSink;
pub use outgoing::MAX_ANSWER;
pub use outgoing::{Delivered, Handler, HandlerSink, Outgoing, SharedSink, Sink, envelope};
