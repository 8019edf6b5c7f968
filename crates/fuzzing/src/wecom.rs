//! The WeCom and WeChat decoders: the whole callback, the AES scheme and the XML reader.

use oncegate_core::{Callback, Headers, Method, RefusalKind, Sealer, WebhookSource};
use oncegate_wecom::xml::Fields;
use oncegate_wecom::{AesKey, WechatApp, WecomApp, crypto};

const KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";
const TOKEN: &str = "fuzz-token";
const CORP: &str = "ww_fuzz";

struct NoHeaders;

impl Headers for NoHeaders {
    fn get(&self, _: &str) -> Option<&str> {
        None
    }
}

/// One callback to a WeCom corp or an Official Account. The first byte chooses: bit 0 the
/// Official Account (safe mode), bit 1 the rest sealed as the platform would (so the fuzzer
/// explores decrypted documents), else the rest is a raw body under a forged signature, bit 2
/// a GET. A forged request must always be the one signature refusal.
pub fn wecom_callback(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (Ok(corp), Ok(account)) = (
        WecomApp::new(CORP, TOKEN, KEY),
        WechatApp::new("wx_fuzz", TOKEN, Some(KEY)),
    ) else {
        panic!("valid apps");
    };
    let (source, sealer): (&dyn WebhookSource, &dyn Sealer) = if mode & 1 != 0 {
        (&account, &account)
    } else {
        (&corp, &corp)
    };
    let method = if mode & 4 != 0 {
        Method::Get
    } else {
        Method::Post
    };
    if mode & 2 != 0 {
        let sealed = sealer.seal(rest, 1_700_000_000, "nonce", [9; 16]);
        let opened = source.decode(&Callback {
            method: Method::Post,
            query: sealed.query.as_deref(),
            headers: &NoHeaders,
            body: &sealed.body,
        });
        if let Ok(oncegate_core::Decoded::Admit { admit, .. }) = &opened {
            assert!(!admit.keys.as_slice().is_empty(), "an event without keys");
        }
        if let Err(refusal) = opened {
            assert_ne!(
                refusal.kind,
                RefusalKind::Unauthenticated,
                "a sealed request failed its signature: {refusal:?}"
            );
        }
        return;
    }
    let forged = source.decode(&Callback {
        method,
        query: Some(
            "msg_signature=0000&signature=0000&timestamp=1&nonce=2&echostr=AAAA&encrypt_type=aes",
        ),
        headers: &NoHeaders,
        body: rest,
    });
    match forged {
        Err(refusal) => assert_eq!(
            (refusal.kind, refusal.label),
            (RefusalKind::Unauthenticated, "bad_signature"),
            "a forgery told more: {refusal:?}"
        ),
        Ok(decoded) => panic!("a forged request passed: {decoded:?}"),
    }
}

/// The AES scheme: decryption of any text, and the round trip of any message for any receive
/// id. The first byte is the receive id's length (mod 24).
pub fn wecom_decrypt(data: &[u8]) {
    let Some((&length, rest)) = data.split_first() else {
        return;
    };
    let Ok(key) = AesKey::from_encoding_aes_key(KEY) else {
        panic!("a valid key");
    };
    let split = usize::from(length % 24).min(rest.len());
    let (receiver, message) = rest.split_at(split);
    let receiver = String::from_utf8_lossy(receiver);
    let _ = crypto::decrypt(&key, &String::from_utf8_lossy(message), &receiver);
    let sealed = crypto::encrypt(&key, message, &receiver, [5; 16]);
    assert_eq!(
        crypto::decrypt(&key, &sealed, &receiver).ok().as_deref(),
        Some(message),
        "round trip"
    );
    let _ = AesKey::from_encoding_aes_key(&String::from_utf8_lossy(message));
}

/// The XML field reader on any bytes: no panic, and what it reads it reads again the same.
pub fn wecom_xml(data: &[u8]) {
    if let Ok(fields) = Fields::parse(data) {
        assert_eq!(Fields::parse(data).ok(), Some(fields), "deterministic");
    }
}
