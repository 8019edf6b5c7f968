//! Where handled events go: an HTTP endpoint (Standard Webhooks), JSON lines, or Rust code.

mod error;
pub(crate) mod file;
#[cfg(feature = "http-sink")]
mod http;
mod lines;
mod outgoing;
#[cfg(feature = "http-sink")]
mod sign;
#[cfg(feature = "http-sink")]
pub(crate) mod stream;

pub use error::{SinkError, SinkSetupError};
#[cfg(feature = "http-sink")]
pub use http::HttpSink;
pub use lines::LinesSink;
pub use outgoing::MAX_ANSWER;
pub use outgoing::{Delivered, Handler, HandlerSink, Outgoing, SharedSink, Sink, envelope};
