//! A WeCom AI bot's long connection as the gateway holds any long connection.

use std::sync::Arc;

use oncegate_core::SharedInlet;
use oncegate_longconn::{Held, Status, Transport};
use oncegate_wecom::AiBot;
use tokio_util::sync::CancellationToken;

use crate::{AiBotConnection, Ended, Outbound, Settings};

/// One AI bot's long connection, to be held by the gateway ([`Transport`]). Its
/// [`Outbound`] is where `/send` hands the bot's own messages while this gateway holds it.
pub struct AiBotTransport {
    bot: AiBot,
    settings: Settings,
    outbound: Arc<Outbound>,
}

impl AiBotTransport {
    /// The long connection of `bot` with `settings`; nothing is checked or dialled before
    /// [`Transport::hold`].
    pub fn new(bot: AiBot, settings: Settings) -> Self {
        Self {
            bot,
            settings,
            outbound: Arc::new(Outbound::default()),
        }
    }

    /// Where messages of the bot's own go out over its connection.
    pub fn outbound(&self) -> Arc<Outbound> {
        self.outbound.clone()
    }
}

impl Transport for AiBotTransport {
    fn platform(&self) -> &str {
        "wecom"
    }

    fn app(&self) -> &str {
        self.bot.bot_id()
    }

    /// WeCom never pushes an AI bot's callback again: a refusal would lose it.
    fn redelivers(&self) -> bool {
        false
    }

    fn hold(&self, inlet: SharedInlet, status: Arc<Status>, stop: CancellationToken) -> Held<'_> {
        Box::pin(async move {
            let client =
                AiBotConnection::new(self.bot.clone(), self.settings.clone(), Arc::new(inlet))
                    .map_err(|error| error.to_string())?;
            let ended = client
                .with_status(status)
                .with_outbound(self.outbound.clone())
                .run(stop)
                .await;
            Ok(match ended {
                Ended::Kicked => oncegate_longconn::Ended::TakenOver,
                Ended::Shutdown | Ended::Fatal(_) => oncegate_longconn::Ended::Stopped,
            })
        })
    }
}
