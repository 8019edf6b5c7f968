//! How the HTTP sink signs (Standard Webhooks): `v1` HMAC-SHA256 signatures with the route's
//! secret and the ones being rotated out, and an asymmetric `v1a` Ed25519 signature with its
//! signing key — every one in the one `webhook-signature` header, space-separated.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::sink::error::SinkSetupError;

/// What signs a route's deliveries: its secret, the secrets being rotated out, its `v1a` key.
#[derive(Default)]
pub(crate) struct Signer {
    pub(crate) secret: Option<Vec<u8>>,
    /// Secrets being rotated out, signed with too.
    pub(crate) previous: Vec<Vec<u8>>,
    /// The `whsk_` key of asymmetric `v1a` signatures, if set.
    pub(crate) signing_key: Option<ring::signature::Ed25519KeyPair>,
}

impl Signer {
    /// Signs with the Ed25519 key `whsk_…` too.
    pub(crate) fn set_signing_key(&mut self, key: &str) -> Result<(), SinkSetupError> {
        self.signing_key = Some(ed25519_key(key)?);
        Ok(())
    }

    /// The `whpk_…` public key receivers verify `v1a` signatures with, if a key is set.
    pub(crate) fn public_key(&self) -> Option<String> {
        use ring::signature::KeyPair;
        self.signing_key
            .as_ref()
            .map(|key| format!("whpk_{}", STANDARD.encode(key.public_key().as_ref())))
    }

    /// Signs with `previous` secrets too, while a receiver moves off them: `webhook-signature`
    /// then holds one `v1` signature per secret, space-separated, the current one first (the
    /// Standard Webhooks rule for rotation). Needs a current secret.
    pub(crate) fn set_previous(&mut self, previous: &[&str]) -> Result<(), SinkSetupError> {
        if self.secret.is_none() && !previous.is_empty() {
            return Err(SinkSetupError::PreviousWithoutSecret);
        }
        self.previous = previous
            .iter()
            .map(|secret| webhook_key(secret))
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// The `webhook-signature` header of one delivery: the current secret's and every previous
    /// one's.
    pub(crate) fn signatures(&self, id: &str, timestamp: u64, body: &[u8]) -> Option<String> {
        let mut signatures: Vec<String> = self
            .secret
            .iter()
            .chain(&self.previous)
            .map(|key| sign(key, id, timestamp, body))
            .collect();
        if let Some(key) = &self.signing_key {
            let signed = [
                id.as_bytes(),
                b".",
                timestamp.to_string().as_bytes(),
                b".",
                body,
            ]
            .concat();
            signatures.push(format!(
                "v1a,{}",
                STANDARD.encode(key.sign(&signed).as_ref())
            ));
        }
        (!signatures.is_empty()).then(|| signatures.join(" "))
    }
}

/// `v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>`.
pub(crate) fn sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| {
        // HMAC takes keys of any length; this cannot happen.
        <Hmac<Sha256> as Mac>::new_from_slice(&[0]).expect("one-byte HMAC key")
    });
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The key of a `whsec_` secret.
pub(crate) fn webhook_key(secret: &str) -> Result<Vec<u8>, SinkSetupError> {
    secret
        .strip_prefix("whsec_")
        .and_then(|b64| STANDARD.decode(b64).ok())
        .filter(|key| !key.is_empty())
        .ok_or(SinkSetupError::Secret)
}

/// The Ed25519 key pair of a `whsk_` key: its 32-byte seed, or the seed and the public key
/// (64 bytes, checked to belong together).
pub(crate) fn ed25519_key(key: &str) -> Result<ring::signature::Ed25519KeyPair, SinkSetupError> {
    let bytes = key
        .strip_prefix("whsk_")
        .and_then(|b64| STANDARD.decode(b64).ok())
        .ok_or(SinkSetupError::SigningKey)?;
    let pair = match bytes.len() {
        32 => ring::signature::Ed25519KeyPair::from_seed_unchecked(&bytes),
        64 => ring::signature::Ed25519KeyPair::from_seed_and_public_key(&bytes[..32], &bytes[32..]),
        _ => return Err(SinkSetupError::SigningKey),
    };
    pair.map_err(|_| SinkSetupError::SigningKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    #[test]
    fn standard_webhooks_reference_signature() {
        let key = STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .expect("base64");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn v1a_keys_sign_as_rfc_8032_says() {
        use ring::signature::KeyPair;
        // RFC 8032, section 7.1, tests 1 and 2: secret key, public key, message, signature.
        let vectors = [
            (
                "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
                "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
                "",
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
            ),
            (
                "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
                "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
                "72",
                "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
            ),
        ];
        for (secret, public, message, signature) in vectors {
            let seed = format!("whsk_{}", STANDARD.encode(unhex(secret)));
            let both = format!(
                "whsk_{}",
                STANDARD.encode([unhex(secret), unhex(public)].concat())
            );
            for key in [seed, both] {
                let pair = ed25519_key(&key).expect("a key");
                assert_eq!(pair.public_key().as_ref(), unhex(public).as_slice());
                assert_eq!(
                    pair.sign(&unhex(message)).as_ref(),
                    unhex(signature).as_slice()
                );
            }
        }
        // A seed with another key's public half, a short key, another prefix: refused.
        let mismatched = format!(
            "whsk_{}",
            STANDARD.encode([unhex(vectors[0].0), unhex(vectors[1].1)].concat())
        );
        for bad in [mismatched, "whsk_AAAA".into(), "whsec_AAAA".into()] {
            assert!(ed25519_key(&bad).is_err(), "{bad}");
        }
    }
}
