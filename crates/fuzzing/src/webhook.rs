//! Generic webhook sources: every preset's whole callback, arbitrary headers and body.

use std::collections::HashMap;

use oncegate_core::{Callback, Decoded, Headers, Method, RefusalKind, WebhookSource};
use oncegate_webhook::{PRESETS, Verify, WebhookApp, preset};

struct Given(HashMap<&'static str, String>);

impl Headers for Given {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// The headers the presets read, each given the same fuzzed value.
const NAMES: &[&str] = &[
    "x-slack-signature",
    "x-slack-request-timestamp",
    "x-hub-signature-256",
    "x-github-event",
    "x-github-delivery",
    "x-github-hook-id",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "x-telegram-bot-api-secret-token",
    "x-signature-ed25519",
    "x-signature-timestamp",
];

/// One callback to a preset's source. The first byte picks the preset (and whether the query
/// carries the fuzzed value too); up to the first newline is every header's value, the rest
/// the body. Never a panic; an admitted event has an id and its key; a request to a source
/// that checks a MAC is refused as unauthenticated (no fuzzed value is a valid MAC).
pub fn webhook_callback(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let name = PRESETS[mode as usize % PRESETS.len()];
    let Some(spec) = preset(name) else {
        panic!("a preset's name");
    };
    let secrets = match spec.verify {
        Verify::Nothing => Vec::new(),
        // RFC 8032's first public key.
        Verify::Ed25519(_) => {
            vec!["d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a".to_owned()]
        }
        _ => vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()],
    };
    let signs = matches!(spec.verify, Verify::Hmac(_) | Verify::Ed25519(_));
    let Ok(app) = WebhookApp::new(spec, "fuzz", secrets) else {
        panic!("the preset {name} builds");
    };
    let split = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let value = String::from_utf8_lossy(&rest[..split]).into_owned();
    let body = rest.get(split + 1..).unwrap_or_default();
    let headers = Given(NAMES.iter().map(|n| (*n, value.clone())).collect());
    let query = format!("key={value}");
    let decoded = app.decode(&Callback {
        method: if mode & 0x80 != 0 {
            Method::Get
        } else {
            Method::Post
        },
        query: (mode & 0x40 != 0).then_some(query.as_str()),
        headers: &headers,
        body,
        tenant: None,
    });
    match decoded {
        Ok(Decoded::Admit { admit, .. }) => {
            assert!(!signs, "{name}: a fuzzed signature passed");
            assert!(
                !admit.event.event_id.is_empty(),
                "{name}: an event without an id"
            );
            assert!(!admit.keys.as_slice().is_empty());
        }
        Ok(_) => assert!(!signs, "{name}: a fuzzed signature passed"),
        Err(refusal) => {
            if signs && mode & 0x80 == 0 {
                assert_eq!(
                    refusal.kind,
                    RefusalKind::Unauthenticated,
                    "{name}: {refusal:?}"
                );
            }
        }
    }
}
