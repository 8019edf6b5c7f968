//! Where handled events go: an HTTP endpoint (Standard Webhooks), JSON lines, or Rust code.

mod error;
pub(crate) mod file;
mod http;
mod lines;
mod outgoing;
mod sign;
pub(crate) mod stream;

pub use error::{SinkError, SinkSetupError};
pub use http::HttpSink;
pub use lines::LinesSink;
pub use outgoing::{Delivered, Handler, HandlerSink, Outgoing, SharedSink, Sink, envelope};
pub use stream::MAX_ANSWER;
