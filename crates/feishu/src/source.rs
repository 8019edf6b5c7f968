//! Feishu/Lark behind the platform seam: one callback in, a challenge, an admission or a card
//! call out.

use bytes::Bytes;
use oncegate_core::{
    Accepted, Admit, Callback, Decoded, Method, Refusal, RefusalKind, Reply, SealedRequest, Sealer,
    Stamp, SyntheticMessage, WebhookSource,
};

use crate::{FeishuApp, FeishuError, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP, Inbound};
use crate::{SignedHeaders, envelope::Verified};

impl From<FeishuError> for Refusal {
    fn from(error: FeishuError) -> Self {
        let kind = match error.status() {
            401 => RefusalKind::Unauthenticated,
            _ => RefusalKind::BadInput,
        };
        Refusal::new(kind, error.label(), error.to_string())
    }
}

impl WebhookSource for FeishuApp {
    fn platform(&self) -> &str {
        self.platform()
    }

    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal> {
        if callback.method != Method::Post {
            return Err(Refusal::new(
                RefusalKind::Method,
                "method",
                "Feishu posts its callbacks: use POST",
            ));
        }
        let headers = SignedHeaders {
            timestamp: callback.headers.get(HEADER_TIMESTAMP),
            nonce: callback.headers.get(HEADER_NONCE),
            signature: callback.headers.get(HEADER_SIGNATURE),
        };
        // The stamp is read after the body checked out, so that an unsigned request learns
        // nothing from it either.
        let inbound = self.open(headers, callback.body)?;
        let stamp = || -> Result<Option<Stamp>, Refusal> {
            // Feishu's nonce is the request's own (its signature covers the body).
            Ok(headers.stamp()?.map(|(timestamp_secs, nonce)| Stamp {
                timestamp_secs,
                nonce: nonce.to_owned(),
                request: None,
            }))
        };
        let admit = |verified: Verified| Admit::new(verified.event, verified.keys);
        Ok(match inbound {
            Inbound::Challenge { challenge } => Decoded::Challenge(Reply::json(
                serde_json::to_vec(&serde_json::json!({ "challenge": challenge }))
                    .unwrap_or_default(),
            )),
            Inbound::Event(verified) => Decoded::Admit {
                admit: admit(verified),
                stamp: stamp()?,
            },
            Inbound::Card(verified) => Decoded::Sync {
                admit: admit(verified),
                stamp: stamp()?,
            },
        })
    }

    fn accepted(&self, how: Accepted) -> Reply {
        Reply::json(Bytes::from_static(match how {
            Accepted::Admitted => br#"{"msg":"success"}"#,
            Accepted::Duplicate => br#"{"msg":"success","duplicate":true}"#,
            Accepted::Spooled => br#"{"msg":"success","spooled":true}"#,
        }))
    }

    /// A store app's tenants; none for an app of one tenant.
    fn tenants(&self) -> Option<std::sync::Arc<dyn oncegate_core::TenantSet>> {
        self.tenants
            .clone()
            .map(|tenants| tenants as std::sync::Arc<dyn oncegate_core::TenantSet>)
    }

    /// A store app's ticket goes to routes as `redacted`.
    fn redacted(&self, event: &oncegate_core::Event) -> Option<bytes::Bytes> {
        self.tenants.as_ref()?;
        crate::store_app::redacted(self.app_id(), event)
    }

    /// A store app's ticket and tenants, from its lifecycle events.
    fn tenancy(&self, event: &oncegate_core::Event) -> Option<oncegate_core::TenancyChange> {
        self.tenants.as_ref()?;
        crate::store_app::tenancy(self.app_id(), event)
    }
}

impl Sealer for FeishuApp {
    fn message(&self, message: &SyntheticMessage) -> Vec<u8> {
        serde_json::json!({
            "schema": "2.0",
            "header": {
                "event_id": message.id,
                "token": self.verification_token.as_deref().unwrap_or(""),
                "create_time": message.created_ms.to_string(),
                "event_type": "im.message.receive_v1",
                "tenant_key": "simulated",
                "app_id": &*self.app_id,
            },
            // Every field Feishu's documented example of im.message.receive_v1 carries that a
            // typed handler reads (`events::MessageReceived`): `chat_type` is not optional.
            "event": {
                "sender": {
                    "sender_id": {"open_id": message.sender},
                    "sender_type": "user",
                    "tenant_key": "simulated",
                },
                "message": {
                    "message_id": format!("om_{}", message.id),
                    "create_time": message.created_ms.to_string(),
                    "chat_id": message.chat,
                    "chat_type": "group",
                    "message_type": "text",
                    "content": serde_json::json!({ "text": message.text }).to_string(),
                }
            }
        })
        .to_string()
        .into_bytes()
    }

    fn seal(
        &self,
        plaintext: &[u8],
        timestamp_secs: u64,
        nonce: &str,
        iv: [u8; 16],
    ) -> SealedRequest {
        let timestamp = timestamp_secs.to_string();
        let (body, signature) = FeishuApp::seal(self, plaintext, &timestamp, nonce, iv);
        let mut headers = vec![
            ("content-type", "application/json".to_owned()),
            (HEADER_TIMESTAMP, timestamp),
            (HEADER_NONCE, nonce.to_owned()),
        ];
        if let Some(signature) = signature {
            headers.push((HEADER_SIGNATURE, signature));
        }
        SealedRequest {
            method: Method::Post,
            query: None,
            headers,
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use oncegate_core::Headers;

    use super::*;

    struct Map(HashMap<&'static str, String>);

    impl Headers for Map {
        fn get(&self, name: &str) -> Option<&str> {
            self.0.get(name).map(String::as_str)
        }
    }

    #[test]
    fn a_signed_event_decodes_to_an_admission_with_its_stamp() {
        let app = FeishuApp::new(
            crate::Cloud::Feishu,
            "cli_s",
            Some("k".into()),
            Some("t".into()),
        )
        .expect("app");
        let plain = r#"{"schema":"2.0","header":{"event_id":"e1","token":"t","event_type":"x","app_id":"cli_s","create_time":"1"},"event":{"chat_id":"oc"}}"#;
        let (body, signature) = app.seal(plain.as_bytes(), "1700000000", "n1", [0; 16]);
        let headers = Map(HashMap::from([
            (HEADER_TIMESTAMP, "1700000000".to_owned()),
            (HEADER_NONCE, "n1".to_owned()),
            (HEADER_SIGNATURE, signature.expect("signed")),
        ]));
        let callback = |method| Callback {
            method,
            query: None,
            headers: &headers,
            body: &body,
            tenant: None,
        };
        let Ok(Decoded::Admit { admit, stamp }) = app.decode(&callback(Method::Post)) else {
            panic!("an admission")
        };
        assert_eq!(&*admit.event.event_id, "e1");
        assert_eq!(admit.nonce, None);
        assert_eq!(
            stamp,
            Some(Stamp {
                timestamp_secs: 1_700_000_000,
                nonce: "n1".into(),
                request: None,
            })
        );
        let refused = app.decode(&callback(Method::Get)).expect_err("GET");
        assert_eq!(refused.kind, RefusalKind::Method);
        let unsigned = Map(HashMap::new());
        let refused = app
            .decode(&Callback {
                headers: &unsigned,
                ..callback(Method::Post)
            })
            .expect_err("unsigned");
        assert_eq!(
            (refused.kind, refused.label),
            (RefusalKind::Unauthenticated, "unsigned")
        );
        assert_eq!(
            app.accepted(Accepted::Duplicate).body,
            br#"{"msg":"success","duplicate":true}"#.as_slice()
        );
    }

    #[test]
    fn what_the_sealer_seals_the_source_opens() {
        let app = FeishuApp::new(
            crate::Cloud::Feishu,
            "cli_s",
            Some("k".into()),
            Some("t".into()),
        )
        .expect("app");
        let plain = Sealer::message(
            &app,
            &SyntheticMessage {
                id: "sim-1".into(),
                chat: "oc_1".into(),
                sender: "ou_1".into(),
                text: "hi \"there\"".into(),
                created_ms: 1_700_000_000_000,
            },
        );
        let sealed = Sealer::seal(&app, &plain, 1_700_000_000, "n9", [4; 16]);
        let headers = Map(sealed
            .headers
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect());
        let decoded = app.decode(&Callback {
            method: sealed.method,
            query: None,
            headers: &headers,
            body: &sealed.body,
            tenant: None,
        });
        let Ok(Decoded::Admit { admit, stamp }) = decoded else {
            panic!("{decoded:?}")
        };
        assert_eq!(&*admit.event.event_id, "sim-1");
        assert_eq!(admit.event.order_key.as_deref(), Some("oc_1"));
        assert_eq!(admit.keys.as_slice().len(), 2);
        assert_eq!(stamp.map(|s| s.nonce), Some("n9".into()));
        // What `oncegate simulate` sends is a message a typed handler reads, as Feishu's are.
        use oncegate_core::FromEvent;
        let message = crate::events::MessageReceived::from_event(&admit.event)
            .unwrap_or_else(|e| panic!("a typed handler cannot read it: {e}"));
        assert_eq!(message.message.chat_type, "group");
        assert_eq!(message.message.text().as_deref(), Some("hi \"there\""));
    }
}
