//! The platform's algorithms: SHA-256 signatures, AES-256-CBC with a SHA-256 key, and the old
//! card callbacks' SHA-1 signature.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use oncegate_core::hex_into;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::FeishuError;

type Decryptor = cbc::Decryptor<aes::Aes256>;
type Encryptor = cbc::Encryptor<aes::Aes256>;

/// The AES key: SHA-256 of the encrypt key.
pub(crate) fn aes_key(encrypt_key: &str) -> [u8; 32] {
    Sha256::digest(encrypt_key.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    hex_into(bytes, &mut out);
    // Only ASCII digits went in.
    String::from_utf8(out).unwrap_or_default()
}

fn signature_digest(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(timestamp.as_bytes());
    hasher.update(nonce.as_bytes());
    hasher.update(encrypt_key.as_bytes());
    hasher.update(body);
    hasher.finalize().into()
}

/// `lowercase_hex(SHA-256(timestamp ‖ nonce ‖ encrypt_key ‖ body))`, over the raw body bytes.
pub fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    hex(&signature_digest(timestamp, nonce, encrypt_key, body))
}

/// Whether `received` is the signature of the request, compared in constant time; the
/// expected hex stays on the stack (it is checked on every request).
pub(crate) fn signature_matches(
    timestamp: &str,
    nonce: &str,
    encrypt_key: &str,
    body: &[u8],
    received: &str,
) -> bool {
    let mut expected = [0u8; 64];
    hex_into(
        &signature_digest(timestamp, nonce, encrypt_key, body),
        &mut expected,
    );
    same(&expected, received)
}

/// The old-style card callback's `lowercase_hex(SHA-1(timestamp ‖ nonce ‖ token ‖ body))`.
pub fn legacy_card_signature(timestamp: &str, nonce: &str, token: &str, body: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(timestamp.as_bytes());
    hasher.update(nonce.as_bytes());
    hasher.update(token.as_bytes());
    hasher.update(body);
    hex(&hasher.finalize())
}

/// Compares a received hex signature with the expected one in constant time.
fn same(expected: &[u8], received: &str) -> bool {
    let received = received.trim().as_bytes();
    // Case-folded byte by byte, in constant time, without a lowered copy per request.
    expected.len() == received.len()
        && bool::from(
            expected
                .iter()
                .zip(received)
                .fold(subtle::Choice::from(1), |same, (e, r)| {
                    same & e.ct_eq(&r.to_ascii_lowercase())
                }),
        )
}

/// Decrypts `base64(iv ‖ AES-256-CBC(PKCS#7))` with the key derived from `encrypt_key`.
pub fn decrypt(encrypt_key: &str, ciphertext: &str) -> Result<Vec<u8>, FeishuError> {
    decrypt_with(&aes_key(encrypt_key), ciphertext)
}

pub(crate) fn decrypt_with(key: &[u8; 32], ciphertext: &str) -> Result<Vec<u8>, FeishuError> {
    let raw = STANDARD
        .decode(ciphertext.trim())
        .map_err(|error| FeishuError::BadCiphertext(format!("not base64: {error}")))?;
    if raw.len() < 32 || raw.len() % 16 != 0 {
        return Err(FeishuError::BadCiphertext(format!(
            "{} bytes is not an IV and whole AES blocks",
            raw.len()
        )));
    }
    let (iv, blocks) = raw.split_at(16);
    let decryptor = Decryptor::new_from_slices(key, iv)
        .map_err(|error| FeishuError::BadCiphertext(format!("bad key or IV: {error}")))?;
    decryptor
        .decrypt_padded_vec_mut::<Pkcs7>(blocks)
        .map_err(|_| FeishuError::BadCiphertext("bad padding: wrong encrypt key?".into()))
}

/// Encrypts as Feishu does, with the given IV.
pub fn encrypt(encrypt_key: &str, plaintext: &[u8], iv: [u8; 16]) -> String {
    encrypt_with(&aes_key(encrypt_key), plaintext, iv)
}

pub(crate) fn encrypt_with(key: &[u8; 32], plaintext: &[u8], iv: [u8; 16]) -> String {
    let encryptor = Encryptor::new(key.into(), &iv.into());
    let mut out = iv.to_vec();
    out.extend(encryptor.encrypt_padded_vec_mut::<Pkcs7>(plaintext));
    STANDARD.encode(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector published in Feishu's documentation.
    #[test]
    fn published_decryption_vector() {
        let plain =
            decrypt("test key", "P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=").expect("decrypt");
        assert_eq!(plain, b"hello world");
    }

    #[test]
    fn encrypt_round_trips_and_wrong_keys_fail() {
        let sealed = encrypt("k1", b"{\"a\":1}", [7; 16]);
        assert_eq!(decrypt("k1", &sealed).expect("decrypt"), b"{\"a\":1}");
        assert!(matches!(
            decrypt("k2", &sealed),
            Err(FeishuError::BadCiphertext(_))
        ));
        assert!(matches!(
            decrypt("k1", "***"),
            Err(FeishuError::BadCiphertext(_))
        ));
        assert!(matches!(
            decrypt("k1", "AAAA"),
            Err(FeishuError::BadCiphertext(_))
        ));
    }

    #[test]
    fn signature_is_sha256_hex_of_the_concatenation() {
        // sha256("1" "2" "3" "4") = sha256("1234")
        assert_eq!(
            signature("1", "2", "3", b"4"),
            "03ac674216f3e15c761ee1a5e255f067953623c8b388b4459e13f978d7c846f4"
        );
        assert!(same(
            signature("1", "2", "3", b"4").as_bytes(),
            "03AC674216F3E15C761EE1A5E255F067953623C8B388B4459E13F978D7C846F4"
        ));
        assert!(!same(signature("1", "2", "3", b"4").as_bytes(), "03ac"));
        let expected = "03ac674216f3e15c761ee1a5e255f067953623c8b388b4459e13f978d7c846f4";
        assert!(signature_matches("1", "2", "3", b"4", expected));
        assert!(signature_matches(
            "1",
            "2",
            "3",
            b"4",
            &expected.to_uppercase()
        ));
        assert!(!signature_matches("1", "2", "3", b"5", expected));
        assert!(!signature_matches("1", "2", "3", b"4", &expected[..62]));
        assert!(!signature_matches(
            "1",
            "2",
            "3",
            b"4",
            &expected.replace("f4", "f5")
        ));
        // sha1("1234")
        assert_eq!(
            legacy_card_signature("1", "2", "3", b"4"),
            "7110eda4d09e062aa5e4a390b0a572ac0d2c0220"
        );
    }
}
