//! Fuzz targets for every decoder that takes outside bytes. Each is a plain function of the
//! input: `fuzz/` runs them under libFuzzer, and `tests/corpus.rs` runs them over the seed
//! corpus and every saved crash, so that a crash once found stays a regression test.
//!
//! A target fails by panicking: on a crash of the code under test, or on a broken invariant it
//! asserts.

mod aibot;
mod dingtalk;
mod feishu_ws;
mod keys;
mod send;
mod webhook;
mod wecom;

pub use aibot::aibot_frames;
pub use dingtalk::{dingtalk_callback, dingtalk_stream_frames};
pub use feishu_ws::feishu_ws_frames;
pub use keys::keys_body;
pub use send::send_body;
pub use webhook::webhook_callback;
pub use wecom::{wecom_callback, wecom_decrypt, wecom_template, wecom_xml};

use oncegate_core::replay::{ReplayGuard, ReplayVerdict};
use oncegate_feishu::{FeishuApp, FeishuError, Inbound, SignedHeaders};

/// A fuzz target: one input, a panic on failure.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus folder.
pub const TARGETS: &[(&str, Target)] = &[
    ("feishu_envelope", feishu_envelope),
    ("feishu_decrypt", feishu_decrypt),
    ("replay_stamp", replay_stamp),
    ("config", config),
    ("wecom_callback", wecom_callback),
    ("wecom_decrypt", wecom_decrypt),
    ("wecom_xml", wecom_xml),
    ("wecom_template", wecom_template),
    ("feishu_ws_frames", feishu_ws_frames),
    ("send_body", send_body),
    ("keys_body", keys_body),
    ("journal_file", journal_file),
    ("spool_entry", spool_entry),
    ("aibot_frames", aibot_frames),
    ("traceparent", traceparent),
    ("webhook_callback", webhook_callback),
    ("dingtalk_callback", dingtalk_callback),
    ("dingtalk_stream_frames", dingtalk_stream_frames),
];

/// A W3C `traceparent` header from an API caller: parsed or refused, never a panic, and what
/// parses names a valid trace and span that print back as they were read.
pub fn traceparent(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Some(context) = oncegate_gateway::parse_traceparent(&text) {
        assert!(context.is_valid() && context.is_remote());
        let printed = format!("{}-{}", context.trace_id(), context.span_id());
        assert!(text.contains(&printed), "{text:?} parsed as {printed}");
    }
}

/// An entry of the outage spool as it lies on disk (either layout, damaged or foreign): it
/// decodes or is refused, never panics, and what decodes is written back as it was read.
pub fn spool_entry(data: &[u8]) {
    if let Ok(spooled) = oncegate_spool::Spooled::decode(data) {
        let again = spooled.encode().expect("a decoded entry encodes");
        assert_eq!(
            oncegate_spool::Spooled::decode(&again).ok(),
            Some(spooled),
            "an entry changes through encode and decode"
        );
    }
}

/// A journal segment or snapshot as it lies on disk (torn, damaged or foreign): opening
/// answers with the changes it replays or why it refuses, and never panics.
pub fn journal_file(data: &[u8]) {
    if let Ok((changes, _torn)) = oncegate_journal::check_file(data) {
        // A frame holds at least 8 bytes of framing: no more changes than that allows.
        assert!(
            changes as usize <= data.len() / 8,
            "{changes} changes from {} bytes",
            data.len()
        );
    }
}

const KEY: &str = "fuzz-encrypt-key";
const TOKEN: &str = "fuzz-token";
const TIMESTAMP: &str = "1700000000";
const NONCE: &str = "fuzz-nonce";

/// The Feishu decoder. The first byte chooses the case: bit 0 an app with an encrypt key,
/// bit 1 a request signed with it, bit 2 the rest sealed (encrypted) first, so that the fuzzer
/// explores decrypted documents without having to learn AES. The rest is the body.
pub fn feishu_envelope(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let keyed = mode & 1 != 0;
    let Ok(app) = FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        "cli_fuzz",
        keyed.then(|| KEY.to_owned()),
        Some(TOKEN.into()),
    ) else {
        panic!("a valid app");
    };
    let body = if mode & 4 != 0 && keyed {
        app.seal(rest, TIMESTAMP, NONCE, [7; 16]).0
    } else {
        rest.to_vec()
    };
    let signature = oncegate_feishu::signature(TIMESTAMP, NONCE, KEY, &body);
    let headers = if mode & 2 != 0 {
        SignedHeaders {
            timestamp: Some(TIMESTAMP),
            nonce: Some(NONCE),
            signature: Some(&signature),
        }
    } else {
        SignedHeaders::default()
    };
    let opened = app.open(headers, &body);
    if keyed && headers.signature.is_none() {
        // The unsigned path has exactly two answers: the challenge, or the one refusal.
        assert!(
            matches!(
                opened,
                Ok(Inbound::Challenge { .. }) | Err(FeishuError::Unsigned)
            ),
            "the unsigned path told more: {opened:?}"
        );
    }
    if let Ok(Inbound::Event(verified) | Inbound::Card(verified)) = &opened {
        assert!(
            !verified.keys.as_slice().is_empty(),
            "an event without keys"
        );
        // What is stored is JSON without a verification token, at the top or in the header.
        // Members as raw text: JSON's grammar, not a tree's limits (a number like 1e999 is
        // JSON, yet no f64).
        type Members<'a> = std::collections::HashMap<String, &'a serde_json::value::RawValue>;
        let payload = &verified.event.payload;
        // What a store asks of every event it queues (is it a message to the bot?) reads
        // anything without a panic.
        for bot in [None, Some("ou_bot")] {
            let _ = oncegate_feishu::events::addresses_bot(&verified.event, bot);
        }
        let top: Members<'_> = serde_json::from_slice(payload).expect("the payload is JSON");
        assert!(!top.contains_key("token"), "a token stored: {payload:?}");
        if let Some(header) = top.get("header")
            && let Ok(header) = serde_json::from_str::<Members<'_>>(header.get())
        {
            assert!(
                !header.contains_key("token"),
                "a header token stored: {payload:?}"
            );
        }
    }
    if let Err(error) = &opened {
        let _ = (error.status(), error.label(), error.to_string());
    }
}

/// AES-256-CBC with the key derived from an encrypt key: decryption of any text, and the round
/// trip of any plaintext. The first byte is the key's length (mod 32).
pub fn feishu_decrypt(data: &[u8]) {
    let Some((&length, rest)) = data.split_first() else {
        return;
    };
    let split = usize::from(length % 32).min(rest.len());
    let (key, text) = rest.split_at(split);
    let key = String::from_utf8_lossy(key);
    let _ = oncegate_feishu::decrypt(&key, &String::from_utf8_lossy(text));
    let sealed = oncegate_feishu::encrypt(&key, text, [3; 16]);
    assert_eq!(
        oncegate_feishu::decrypt(&key, &sealed).ok().as_deref(),
        Some(text),
        "round trip"
    );
}

/// The replay stamp (timestamp and nonce headers) and the guard that checks it: lines of
/// `timestamp nonce now` run through parse, check and remember.
pub fn replay_stamp(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut guard = ReplayGuard::new(300, 64);
    for line in text.lines().take(256) {
        let mut parts = line.splitn(3, ' ');
        let headers = SignedHeaders {
            timestamp: parts.next(),
            nonce: parts.next(),
            signature: None,
        };
        let now = parts
            .next()
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(1_700_000_000);
        let Ok(Some((timestamp, nonce))) = headers.stamp() else {
            continue;
        };
        match guard.check(timestamp, nonce, now) {
            ReplayVerdict::Fresh => {
                guard.remember(nonce, now);
                assert_eq!(
                    guard.check(timestamp, nonce, now),
                    ReplayVerdict::Replayed,
                    "a remembered nonce is a replay"
                );
            }
            ReplayVerdict::Stale { .. } | ReplayVerdict::Replayed | ReplayVerdict::Saturated => {}
        }
    }
}

/// The configuration loader: TOML text, then after a NUL byte `NAME=value` lines taken as the
/// environment; whatever loads is validated.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (toml, env) = text.split_once('\0').unwrap_or((&text, ""));
    let env: Vec<(String, String)> = env
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    if let Ok(config) = oncegate_config::load_str(toml, std::path::Path::new("fuzz.toml"), env) {
        let _ = oncegate_config::validate(&config);
    }
}
