//! The Feishu/Lark long connection as the gateway holds any long connection.

use std::sync::Arc;

use oncegate_core::SharedInlet;
use oncegate_feishu::FeishuApp;
use oncegate_longconn::{Ended, Held, Status, Transport};
use tokio_util::sync::CancellationToken;

use crate::{LongConnection, Settings};

/// One Feishu or Lark app's long connection, to be held by the gateway ([`Transport`]).
pub struct FeishuTransport {
    app: FeishuApp,
    settings: Settings,
}

impl FeishuTransport {
    /// The long connection of `app` with `settings`; nothing is checked or dialled before
    /// [`Transport::hold`].
    pub fn new(app: FeishuApp, settings: Settings) -> Self {
        Self { app, settings }
    }
}

impl Transport for FeishuTransport {
    fn platform(&self) -> &str {
        self.app.platform()
    }

    fn app(&self) -> &str {
        self.app.app_id()
    }

    /// Feishu pushes an unacknowledged event again.
    fn redelivers(&self) -> bool {
        true
    }

    fn hold(&self, inlet: SharedInlet, status: Arc<Status>, stop: CancellationToken) -> Held<'_> {
        Box::pin(async move {
            let client =
                LongConnection::new(self.app.clone(), self.settings.clone(), Arc::new(inlet))
                    .map_err(|error| error.to_string())?;
            Arc::new(client.with_status(status)).run(stop).await;
            Ok(Ended::Stopped)
        })
    }
}
