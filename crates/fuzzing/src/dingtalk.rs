//! DingTalk's event subscription: the whole callback, sealed as DingTalk does or forged.

use oncegate_core::{Callback, Decoded, Method, RefusalKind, Sealer, WebhookSource};
use oncegate_dingtalk::DingtalkApp;

use crate::wecom::NoHeaders;

/// One callback. The first byte chooses: bit 0 the rest sealed as DingTalk would (so the
/// fuzzer explores decrypted documents: an admitted event has its id and key, and nothing
/// sealed is refused as unauthenticated), else the rest is a raw body under a query made of
/// its first line (a forgery: never taken, unless it is DingTalk's own vector).
pub fn dingtalk_callback(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(app) = DingtalkApp::new(
        "mryue",
        "Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7",
        "ding6ccabc44d2c8d38b",
    ) else {
        panic!("a valid app");
    };
    if mode & 1 != 0 {
        let sealed = app.seal(rest, 1_700_000_000, "nonce", [9; 16]);
        let opened = app.decode(&Callback {
            method: Method::Post,
            query: sealed.query.as_deref(),
            headers: &NoHeaders,
            body: &sealed.body,
            tenant: None,
        });
        match opened {
            Ok(Decoded::Admit { admit, .. }) => {
                assert!(!admit.event.event_id.is_empty() && !admit.keys.as_slice().is_empty());
            }
            Ok(_) => {}
            Err(refusal) => assert_ne!(
                refusal.kind,
                RefusalKind::Unauthenticated,
                "a sealed request failed its signature: {refusal:?}"
            ),
        }
        return;
    }
    let split = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let query = String::from_utf8_lossy(&rest[..split]).into_owned();
    let body = rest.get(split + 1..).unwrap_or_default();
    let taken = app.decode(&Callback {
        method: Method::Post,
        query: Some(&query),
        headers: &NoHeaders,
        body,
        tenant: None,
    });
    // The only signed request the fuzzer can hold is the official vector of the seed corpus.
    if taken.is_ok() {
        assert!(
            query.contains("03044561471240d4a14bb09372dfcfd4fd0e40cb"),
            "a forged DingTalk callback was taken: {query}"
        );
    }
}
