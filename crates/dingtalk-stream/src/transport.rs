//! DingTalk's Stream mode as the gateway holds any long connection.

use std::sync::Arc;

use oncegate_core::SharedInlet;
use oncegate_longconn::{Ended, Held, Status, Transport};
use tokio_util::sync::CancellationToken;

use crate::{Settings, StreamConnection};

/// One DingTalk app's Stream connection, to be held by the gateway ([`Transport`]).
pub struct StreamTransport {
    settings: Settings,
}

impl StreamTransport {
    /// The Stream connection with `settings`; nothing is checked or dialled before
    /// [`Transport::hold`].
    pub fn new(settings: Settings) -> Self {
        Self { settings }
    }
}

impl Transport for StreamTransport {
    fn platform(&self) -> &str {
        "dingtalk"
    }

    fn app(&self) -> &str {
        &self.settings.client_id
    }

    /// Events acked `LATER` are pushed again, but robot messages are documented as pushed
    /// once: refusing one at the queue bound could lose it, so none is refused there.
    fn redelivers(&self) -> bool {
        false
    }

    fn hold(&self, inlet: SharedInlet, status: Arc<Status>, stop: CancellationToken) -> Held<'_> {
        Box::pin(async move {
            let client = StreamConnection::new(self.settings.clone(), Arc::new(inlet))
                .map_err(|error| error.to_string())?;
            client.with_status(status).run(stop).await;
            Ok(Ended::Stopped)
        })
    }
}
