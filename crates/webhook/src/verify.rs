//! Whether a request comes from the platform: a MAC over the configured bytes with any of the
//! secrets (rotation), a shared token, or — only when configured so — nothing. Every compare of
//! secret-derived bytes is constant-time.

use hmac::{Hmac as HmacOf, Mac};
use oncegate_core::{Refusal, RefusalKind};
use subtle::ConstantTimeEq;

use crate::request::Request;
use crate::spec::{Ed25519, Encoding, Hash, Hmac, KeyEncoding, Part, Template, Verify};

/// What a secret is to its check.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Key {
    /// A MAC's key, so encoded.
    Mac(KeyEncoding),
    /// An Ed25519 public key in hex.
    Ed25519,
}

/// One configured secret: its text (what a token equals, what `{secret}` writes) and the MAC
/// key made of it.
pub(crate) struct Secret {
    pub(crate) text: Vec<u8>,
    pub(crate) key: Vec<u8>,
}

impl Secret {
    /// `text` as `key` makes it a key; `None` when it does not decode.
    pub(crate) fn new(text: &str, key: Key) -> Option<Self> {
        use base64::Engine as _;
        let key = match key {
            Key::Mac(KeyEncoding::Text) => text.as_bytes().to_vec(),
            Key::Mac(KeyEncoding::Base64) => base64::engine::general_purpose::STANDARD
                .decode(text.strip_prefix("whsec_").unwrap_or(text))
                .ok()?,
            Key::Ed25519 => hex(text.trim()).filter(|key| key.len() == 32)?,
        };
        Some(Self {
            text: text.as_bytes().to_vec(),
            key,
        })
    }
}

/// The values a signed template reads besides the body.
pub(crate) struct Signed<'a> {
    pub(crate) timestamp: Option<&'a str>,
    pub(crate) id: Option<&'a str>,
}

fn unauthenticated(label: &'static str, message: String) -> Refusal {
    Refusal::new(RefusalKind::Unauthenticated, label, message)
}

/// Checks `request` by `verify`: `Ok` with the signature that matched (the request's own
/// nonce), or the refusal.
pub(crate) fn check(
    verify: &Verify,
    secrets: &[Secret],
    request: &Request<'_>,
    signed: &Signed<'_>,
) -> Result<Option<String>, Refusal> {
    match verify {
        Verify::Nothing => Ok(None),
        Verify::Token { at } => {
            let given = request.get(at)?.ok_or_else(|| {
                unauthenticated(
                    "missing_token",
                    format!("no token at {at}: the platform sends one with every request"),
                )
            })?;
            if secrets
                .iter()
                .any(|secret| bool::from(secret.text.ct_eq(given.as_bytes())))
            {
                Ok(None)
            } else {
                Err(unauthenticated(
                    "bad_token",
                    format!("the token at {at} is not this source's"),
                ))
            }
        }
        Verify::Ed25519(settings) => ed25519(settings, secrets, request, signed),
        Verify::Hmac(hmac) => {
            let given = request.get(&hmac.signature)?.ok_or_else(|| {
                unauthenticated(
                    "missing_signature",
                    format!(
                        "no signature at {}: the platform signs every request",
                        hmac.signature
                    ),
                )
            })?;
            let candidates: Vec<Vec<u8>> = match hmac.separator {
                Some(separator) => given
                    .split(separator)
                    .filter_map(|s| decoded(hmac, s))
                    .collect(),
                None => decoded(hmac, &given).into_iter().collect(),
            };
            if candidates.is_empty() {
                return Err(unauthenticated(
                    "bad_signature",
                    format!(
                        "the signature at {} is not {}{} as this source expects",
                        hmac.signature,
                        hmac.prefix,
                        match hmac.encoding {
                            Encoding::Hex => "hex",
                            Encoding::Base64 => "base64",
                        }
                    ),
                ));
            }
            let body = request.body();
            let matches = secrets.iter().any(|secret| {
                let expected = mac(
                    hmac.hash,
                    &secret.key,
                    &message(&hmac.signed, body, signed, &secret.text),
                );
                candidates
                    .iter()
                    .any(|candidate| bool::from(candidate.as_slice().ct_eq(&expected)))
            });
            if matches {
                Ok(Some(given.chars().take(64).collect()))
            } else {
                Err(unauthenticated(
                    "bad_signature",
                    format!(
                        "the signature at {} does not match: another secret, or a changed body",
                        hmac.signature
                    ),
                ))
            }
        }
    }
}

/// An Ed25519 signature (hex) by one of the keys.
fn ed25519(
    ed25519: &Ed25519,
    secrets: &[Secret],
    request: &Request<'_>,
    signed: &Signed<'_>,
) -> Result<Option<String>, Refusal> {
    use ring::signature::{ED25519, UnparsedPublicKey};
    let given = request.get(&ed25519.signature)?.ok_or_else(|| {
        unauthenticated(
            "missing_signature",
            format!(
                "no signature at {}: the platform signs every request",
                ed25519.signature
            ),
        )
    })?;
    let signature = hex(given.trim()).filter(|s| s.len() == 64).ok_or_else(|| {
        unauthenticated(
            "bad_signature",
            format!(
                "the signature at {} is not 64 bytes of hex",
                ed25519.signature
            ),
        )
    })?;
    let message = message(&ed25519.signed, request.body(), signed, &[]);
    if secrets.iter().any(|secret| {
        UnparsedPublicKey::new(&ED25519, &secret.key)
            .verify(&message, &signature)
            .is_ok()
    }) {
        Ok(Some(given.chars().take(64).collect()))
    } else {
        Err(unauthenticated(
            "bad_signature",
            format!(
                "the signature at {} does not verify: another key, or a changed body",
                ed25519.signature
            ),
        ))
    }
}

/// One signature's bytes, its prefix removed; `None` when it lacks the prefix or does not decode.
fn decoded(hmac: &Hmac, text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let text = text.trim().strip_prefix(hmac.prefix.as_str())?;
    match hmac.encoding {
        Encoding::Hex => hex(text),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.decode(text).ok(),
    }
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16);
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

/// The bytes `template` makes of this request.
fn message(template: &Template, body: &[u8], signed: &Signed<'_>, secret: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(body.len() + 64);
    for part in &template.0 {
        match part {
            Part::Text(text) => bytes.extend_from_slice(text.as_bytes()),
            Part::Body => bytes.extend_from_slice(body),
            Part::Timestamp => bytes.extend_from_slice(signed.timestamp.unwrap_or("").as_bytes()),
            Part::Id => bytes.extend_from_slice(signed.id.unwrap_or("").as_bytes()),
            Part::Secret => bytes.extend_from_slice(secret),
        }
    }
    bytes
}

fn mac(hash: Hash, key: &[u8], message: &[u8]) -> Vec<u8> {
    fn with<M: Mac + hmac::digest::KeyInit>(key: &[u8], message: &[u8]) -> Vec<u8> {
        // An HMAC takes a key of any length.
        let Ok(mut mac) = <M as hmac::digest::KeyInit>::new_from_slice(key) else {
            return Vec::new();
        };
        mac.update(message);
        mac.finalize().into_bytes().to_vec()
    }
    match hash {
        Hash::Sha1 => with::<HmacOf<sha1::Sha1>>(key, message),
        Hash::Sha256 => with::<HmacOf<sha2::Sha256>>(key, message),
        Hash::Sha512 => with::<HmacOf<sha2::Sha512>>(key, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's published vector ("Testing the webhook payload validation").
    #[test]
    fn githubs_vector() {
        let mac = mac(
            Hash::Sha256,
            b"It's a Secret to Everybody",
            b"Hello, World!",
        );
        assert_eq!(
            hex("757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17").expect("hex"),
            mac
        );
    }

    /// RFC 8032's first Ed25519 test (an empty message), through the check.
    #[test]
    fn rfc_8032_test_1() {
        use oncegate_core::{Callback, Headers, Method};
        struct One(String);
        impl Headers for One {
            fn get(&self, name: &str) -> Option<&str> {
                (name == "x-signature-ed25519").then_some(self.0.as_str())
            }
        }
        let settings = Ed25519 {
            signature: crate::Location::parse("header:X-Signature-Ed25519").expect("location"),
            signed: Template::body(),
        };
        let key = Secret::new(
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
            Key::Ed25519,
        )
        .expect("a public key");
        let check = |signature: &str| {
            let headers = One(signature.to_owned());
            let callback = Callback {
                method: Method::Post,
                query: None,
                headers: &headers,
                body: b"",
                tenant: None,
            };
            let request = Request::new(&callback);
            let signed = Signed {
                timestamp: None,
                id: None,
            };
            ed25519(&settings, std::slice::from_ref(&key), &request, &signed).map(|_| ())
        };
        let good = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";
        assert!(check(good).is_ok());
        let flipped = good.replacen("e5", "e4", 1);
        assert!(check(&flipped).is_err());
        assert!(check("00").is_err());
    }

    #[test]
    fn hex_refuses_what_is_not() {
        assert_eq!(hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(hex("0"), None);
        assert_eq!(hex("zz"), None);
    }
}
