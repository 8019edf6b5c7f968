//! Which queued events go first: the store's rule, by the routes in force and what each
//! platform says of its messages. Only a Feishu message's payload is read; with encryption at
//! rest it alone is opened, so no other event pays for a decryption on its way into the queue.

use std::collections::HashMap;
use std::sync::Arc;

use oncegate_config::{Config, PlatformConfig, Priority};
use oncegate_core::Event;

use crate::base::at_rest::AtRest;
use crate::route::Routes;

/// The store's rule for which events go first: by the routes in force at the time (a reload
/// changes it for what is queued afterwards), what each platform says of its messages.
pub(crate) struct FirstByRoute {
    routes: Arc<arc_swap::ArcSwap<Routes>>,
    /// The key payloads are sealed with at rest, if they are: the store asks of sealed events.
    at_rest: Option<Arc<AtRest>>,
}

impl FirstByRoute {
    /// The rule by `routes`, opening payloads with `at_rest` where the store keeps them sealed.
    pub(crate) fn new(
        routes: Arc<arc_swap::ArcSwap<Routes>>,
        at_rest: Option<Arc<AtRest>>,
    ) -> Self {
        Self { routes, at_rest }
    }
}

impl oncegate_core::Precedence for FirstByRoute {
    fn first(&self, event: &Event) -> bool {
        let routes = self.routes.load();
        match routes.priority_of(event) {
            Priority::None => false,
            Priority::All => true,
            Priority::Mentions => addresses_bot(event, &routes.bots, self.at_rest.as_deref()),
        }
    }
}

/// Whether `event` is a message a person addressed to the bot (an @-mention of it, a direct
/// message), as its platform tells; `bots` names each app's bot where it is configured.
fn addresses_bot(event: &Event, bots: &HashMap<String, String>, at_rest: Option<&AtRest>) -> bool {
    let _ = (bots, at_rest);
    match &*event.platform {
        #[cfg(feature = "feishu")]
        "feishu" | "lark" => {
            use oncegate_core::FromEvent;
            use oncegate_feishu::events::{MessageReceived, addresses_bot};
            let bot = bots.get(&*event.app).map(String::as_str);
            match at_rest {
                Some(at_rest) if MessageReceived::EVENT_TYPES.contains(&&*event.event_type) => {
                    let mut opened = event.clone();
                    at_rest.open_event(&mut opened).is_ok() && addresses_bot(&opened, bot)
                }
                _ => addresses_bot(event, bot),
            }
        }
        // Read from the event type alone: nothing to open.
        #[cfg(feature = "wecom")]
        "wecom" | "wechat" => oncegate_wecom::events::addresses_bot(event),
        _ => false,
    }
}

/// Each configured app's bot id, by app id: a Feishu or Lark app's `bot_open_id`.
pub(crate) fn bot_ids(config: &Config) -> HashMap<String, String> {
    config
        .sources
        .iter()
        .filter_map(|source| match &source.platform {
            PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => settings
                .bot_open_id
                .clone()
                .map(|bot| (settings.app_id.clone(), bot)),
            _ => None,
        })
        .collect()
}

#[cfg(all(test, feature = "feishu", feature = "wecom", feature = "at-rest"))]
mod tests {
    use super::*;
    use oncegate_core::Precedence;

    /// Feishu's documented `im.message.receive_v1`, as a `p2p` message of `chat_type`.
    fn feishu(chat_type: &str, event_type: &str) -> Event {
        let payload = format!(
            r#"{{"schema":"2.0","header":{{"event_id":"5e3702a84e847582be8db7fb73283c02","event_type":"{event_type}","create_time":"1608725989000","app_id":"cli_9f5343c580712544","tenant_key":"2ca1d211f64f6438"}},"event":{{"sender":{{"sender_id":{{"open_id":"ou_84aad35d084aa403a838cf73ee18467"}},"sender_type":"user","tenant_key":"736588c9260f175e"}},"message":{{"message_id":"om_5ce6d572455d361153b7cb51da133945","chat_id":"oc_5ce6d572455d361153b7xx51da133945","chat_type":"{chat_type}","message_type":"text","content":"{{\"text\":\"hello\"}}"}}}}}}"#
        );
        Event {
            platform: "feishu".into(),
            app: "cli_9f5343c580712544".into(),
            tenant: Some("2ca1d211f64f6438".into()),
            event_id: "5e3702a84e847582be8db7fb73283c02".into(),
            event_type: event_type.into(),
            created_at_ms: 1_608_725_989_000,
            order_key: Some("oc_5ce6d572455d361153b7xx51da133945".into()),
            payload: payload.into_bytes().into(),
        }
    }

    fn routes(priority: Priority) -> Arc<arc_swap::ArcSwap<Routes>> {
        let sink: crate::sink::SharedSink = Arc::new(crate::sink::LinesSink::stdout());
        let mut route = crate::route::Route::new(&["*"], sink, crate::StaleEvents::Deliver, false);
        route.priority = priority;
        Arc::new(arc_swap::ArcSwap::from_pointee(Routes::of(vec![Arc::new(
            route,
        )])))
    }

    /// With payloads sealed at rest, a Feishu message is opened to be read and goes first as
    /// it would in clear; without the key, its sealed payload reads as nobody's; a route's
    /// `priority` decides before anything is read.
    #[test]
    fn a_sealed_message_is_read_opened_and_the_route_decides_first() {
        let settings = oncegate_config::EncryptionSettings {
            keys: vec![oncegate_config::EncryptionKey {
                id: "k1".into(),
                key: Some(oncegate_config::Secret::Inline(
                    "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=".into(),
                )),
            }],
        };
        let at_rest = Arc::new(AtRest::new(&settings).expect("keys"));
        let direct = feishu("p2p", "im.message.receive_v1");
        let sealed = at_rest.seal_event(direct.clone()).expect("sealed");
        assert_ne!(sealed.payload, direct.payload);
        let rule = FirstByRoute::new(routes(Priority::Mentions), Some(at_rest.clone()));
        assert!(rule.first(&direct), "in clear");
        assert!(rule.first(&sealed), "sealed, opened to be read");
        let blind = FirstByRoute::new(routes(Priority::Mentions), None);
        assert!(!blind.first(&sealed), "sealed and not opened: unreadable");
        // A group message mentioning nobody, sealed: not first.
        let group = at_rest
            .seal_event(feishu("group", "im.message.receive_v1"))
            .expect("sealed");
        assert!(!rule.first(&group));
        // The route decides first: none or all, whatever the message.
        let none = FirstByRoute::new(routes(Priority::None), Some(at_rest.clone()));
        assert!(!none.first(&sealed));
        let all = FirstByRoute::new(routes(Priority::All), Some(at_rest.clone()));
        assert!(all.first(&group));
        // A WeCom message is read from its type: sealed or not, it goes first.
        let mut wecom = feishu("p2p", "message.text");
        wecom.platform = "wecom".into();
        let wecom = at_rest.seal_event(wecom).expect("sealed");
        assert!(rule.first(&wecom));
    }
}
