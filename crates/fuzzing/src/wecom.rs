//! The WeCom and WeChat decoders: the whole callback, the AES scheme and the XML reader.

use oncegate_core::{Callback, Headers, Method, RefusalKind, Sealer, TenantSet, WebhookSource};
use oncegate_wecom::xml::Fields;
use oncegate_wecom::{AesKey, WechatApp, WecomApp, WecomCorps, crypto};

const KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";
const TOKEN: &str = "fuzz-token";
const CORP: &str = "ww_fuzz";

/// A request without headers.
pub(crate) struct NoHeaders;

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
            tenant: None,
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
        tenant: None,
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

/// A template serving self-built apps of many corps. The first byte chooses: bit 0 the rest is
/// a corp's registry settings (taken or left out with a reason, never a panic, and the check
/// before adding agrees with what the registry takes); else the rest is a callback body under
/// a forged signature, at the one URL for all (bit 1 clear) or at the registered corp's URL,
/// bit 2 a GET. A forgery is refused with the one answer of an unsigned callback, whether its
/// corp is served, a stranger or not named — never admitted.
pub fn wecom_template(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let template = WecomCorps::new();
    let corps = template.corps();
    if mode & 1 != 0 {
        let checked = corps.check_settings(rest);
        let left_out =
            corps.replace_with_settings(vec![(CORP.into(), bytes::Bytes::copy_from_slice(rest))]);
        assert_eq!(
            checked.is_ok(),
            left_out.is_empty(),
            "{checked:?} {left_out:?}"
        );
        assert_eq!(corps.contains(CORP), left_out.is_empty());
        return;
    }
    let settings =
        format!("{{\"token\": \"{TOKEN}\", \"encoding_aes_key\": \"{KEY}\", \"agent_id\": 1}}");
    let left_out = corps.replace_with_settings(vec![(CORP.into(), bytes::Bytes::from(settings))]);
    assert!(left_out.is_empty(), "{left_out:?}");
    let method = if mode & 4 != 0 {
        Method::Get
    } else {
        Method::Post
    };
    let forged = template.decode(&Callback {
        method,
        query: Some("msg_signature=0000&timestamp=1&nonce=2&echostr=AAAA"),
        headers: &NoHeaders,
        body: rest,
        tenant: (mode & 2 != 0).then_some(CORP),
    });
    match forged {
        // Whatever the corp (known, a stranger, none named), the one answer of an unsigned
        // callback: a prober learns nothing of which corps the template serves.
        Err(refusal) => assert!(
            refusal.kind == RefusalKind::Unauthenticated
                && refusal.message == oncegate_wecom::WecomError::BadSignature.refusal().message,
            "a forgery told more: {refusal:?}"
        ),
        Ok(decoded) => panic!("a forged request passed: {decoded:?}"),
    }
}
