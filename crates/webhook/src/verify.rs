//! Whether a request comes from the platform: a MAC over the configured bytes with any of the
//! secrets (rotation), a shared token, or — only when configured so — nothing. Every compare of
//! secret-derived bytes is constant-time.

use hmac::{Hmac as HmacOf, Mac};
use oncegate_core::{Refusal, RefusalKind};
use subtle::ConstantTimeEq;

use crate::request::Request;
use crate::spec::{Encoding, Hash, Hmac, KeyEncoding, Part, Template, Verify};

/// One configured secret: its text (what a token equals, what `{secret}` writes) and the MAC
/// key made of it.
pub(crate) struct Secret {
    pub(crate) text: Vec<u8>,
    pub(crate) key: Vec<u8>,
}

impl Secret {
    /// `text` as `encoding` makes it a key; `None` when it does not decode.
    pub(crate) fn new(text: &str, encoding: KeyEncoding) -> Option<Self> {
        use base64::Engine as _;
        let key = match encoding {
            KeyEncoding::Text => text.as_bytes().to_vec(),
            KeyEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(text.strip_prefix("whsec_").unwrap_or(text))
                .ok()?,
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

    #[test]
    fn hex_refuses_what_is_not() {
        assert_eq!(hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(hex("0"), None);
        assert_eq!(hex("zz"), None);
    }
}
