//! An unsigned AI-bot body is refused without being built into a JSON tree: the memory the
//! refusal takes does not grow with what the body holds beside `encrypt` (256 such 1 MB bodies
//! once took the gateway from 161 to 319 MB). Its own test binary, so that the process's peak
//! resident memory is this test's.

use oncegate_core::{Callback, Headers, Method, WebhookSource};
use oncegate_wecom::WecomApp;

struct NoHeaders;

impl Headers for NoHeaders {
    fn get(&self, _: &str) -> Option<&str> {
        None
    }
}

/// The process's peak resident memory so far, in KiB (`VmHWM`).
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[test]
fn an_unsigned_json_body_is_refused_without_a_tree() {
    let app = WecomApp::new(
        "ww_bot",
        "bot-token",
        "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C",
    )
    .expect("app");
    // About 2 MB: two hundred thousand small objects beside the field that matters.
    let mut body = String::from("{\"pad\":[");
    for i in 0..200_000 {
        if i > 0 {
            body.push(',');
        }
        body.push_str("{\"k\":1}");
    }
    body.push_str("],\"encrypt\":\"AAAA\"}");
    let callback = Callback {
        method: Method::Post,
        query: Some("msg_signature=0000&timestamp=1700000000&nonce=n1"),
        headers: &NoHeaders,
        body: body.as_bytes(),
        tenant: None,
    };
    let before = peak_kib();
    let refused = app.decode(&callback);
    let grown = peak_kib().saturating_sub(before);
    let refusal = refused.expect_err("unsigned");
    assert_eq!(refusal.kind, oncegate_core::RefusalKind::Unauthenticated);
    // A tree of 200 000 objects takes tens of MiB; the typed read, nothing beyond the body.
    assert!(
        grown < 4 * 1024,
        "the peak grew by {grown} KiB to refuse a {} byte body",
        body.len()
    );
}
