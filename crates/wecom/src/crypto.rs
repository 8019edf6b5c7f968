//! The platforms' callback crypto (WeCom, and WeChat's safe mode): the SHA-1 signature of sorted
//! strings, the EncodingAESKey, AES-256-CBC with the IV from the key, PKCS#7 to a 32-byte block,
//! and the plaintext layout `random(16) ‖ length(4, big-endian) ‖ message ‖ receive id`.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::NoPadding};
use base64::Engine;
use base64::alphabet::STANDARD as ALPHABET;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use sha1::{Digest, Sha1};
use subtle::ConstantTimeEq;

use crate::WecomError;

type Decryptor = cbc::Decryptor<aes::Aes256>;
type Encryptor = cbc::Encryptor<aes::Aes256>;

/// The padding block: PKCS#7 to a multiple of 32 bytes, pad values 1..=32.
const BLOCK: usize = 32;
/// The random prefix and the length field.
const HEADER: usize = 16 + 4;

/// Real EncodingAESKeys have non-zero bits after the last whole byte (43 characters carry 258
/// bits); a strict decoder refuses them, the platforms do not.
const KEY_DECODER: GeneralPurpose = GeneralPurpose::new(
    &ALPHABET,
    GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// The 32-byte AES key of an EncodingAESKey.
#[derive(Clone)]
pub struct AesKey([u8; 32]);

impl std::fmt::Debug for AesKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AesKey(..)")
    }
}

impl AesKey {
    /// Decodes the 43-character EncodingAESKey the platform's console shows.
    pub fn from_encoding_aes_key(encoding: &str) -> Result<Self, WecomError> {
        let encoding = encoding.trim();
        if encoding.len() != 43 {
            return Err(WecomError::BadKey(format!(
                "an EncodingAESKey has 43 characters, this one has {}; copy it again from the console",
                encoding.chars().count()
            )));
        }
        let bytes = KEY_DECODER
            .decode(format!("{encoding}="))
            // The decoder's error names the offending character: never echo a secret's bytes.
            .map_err(|_| {
                WecomError::BadKey("not base64 (only A-Z, a-z, 0-9, + and / belong in it)".into())
            })?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|_| WecomError::BadKey("does not decode to 32 bytes".into()))?;
        Ok(Self(key))
    }

    fn decryptor(&self) -> Decryptor {
        Decryptor::new(&self.0.into(), &self.iv().into())
    }

    fn encryptor(&self) -> Encryptor {
        Encryptor::new(&self.0.into(), &self.iv().into())
    }

    fn iv(&self) -> [u8; 16] {
        let mut iv = [0u8; 16];
        iv.copy_from_slice(&self.0[..16]);
        iv
    }
}

/// `lowercase_hex(SHA-1(bytes))`: a request's identity for the replay memory.
pub fn digest(bytes: &[u8]) -> String {
    hex(&Sha1::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

/// `lowercase_hex(SHA-1(sorted parts, concatenated))`: WeCom's `msg_signature` (token,
/// timestamp, nonce, Encrypt or echostr) and WeChat's plain `signature` (token, timestamp,
/// nonce). Sorting is by bytes, as the SDKs do.
pub fn signature(parts: &[&str]) -> String {
    let mut sorted: Vec<&str> = parts.to_vec();
    sorted.sort_unstable();
    let mut hasher = Sha1::new();
    for part in sorted {
        hasher.update(part.as_bytes());
    }
    hex(&hasher.finalize())
}

/// Whether `received` is the signature of `parts`, compared in constant time.
pub fn verify(received: &str, parts: &[&str]) -> bool {
    let expected = signature(parts);
    let received = received.trim().to_ascii_lowercase();
    expected.len() == received.len() && bool::from(expected.as_bytes().ct_eq(received.as_bytes()))
}

/// Decrypts a base64 `Encrypt` (or `echostr`) and checks that it was meant for `receive_id`.
/// Returns the message.
pub fn decrypt(key: &AesKey, ciphertext: &str, receive_id: &str) -> Result<Vec<u8>, WecomError> {
    decrypt_for(key, ciphertext, &[receive_id])
}

/// `decrypt`, for a message meant for any of `receive_ids`.
pub fn decrypt_for(
    key: &AesKey,
    ciphertext: &str,
    receive_ids: &[&str],
) -> Result<Vec<u8>, WecomError> {
    let (message, receiver) = decrypt_any(key, ciphertext)?;
    if !receive_ids.contains(&receiver.as_str()) {
        return Err(WecomError::WrongReceiver {
            expected: receive_ids.first().copied().unwrap_or_default().to_owned(),
            got: receiver,
        });
    }
    Ok(message)
}

/// `decrypt` for a source that serves many receivers (a suite's corps): the message and the
/// receive id it was encrypted for, which the caller checks — as an opaque, case-sensitive
/// string (an encrypted corp id is case-sensitive).
pub fn decrypt_any(key: &AesKey, ciphertext: &str) -> Result<(Vec<u8>, String), WecomError> {
    let raw = STANDARD
        .decode(ciphertext.trim())
        .map_err(|error| WecomError::BadCiphertext(format!("not base64: {error}")))?;
    if raw.is_empty() || raw.len() % BLOCK != 0 {
        return Err(WecomError::BadCiphertext(format!(
            "{} bytes is not a whole number of 32-byte blocks",
            raw.len()
        )));
    }
    let (message, receiver) = open_raw(key, &raw)?;
    let receiver = String::from_utf8(receiver)
        .map_err(|_| WecomError::BadCiphertext("the receive id is not UTF-8".into()))?;
    Ok((message, receiver))
}

/// Decrypts whole blocks and splits the layout: (message, receive id).
fn open_raw(key: &AesKey, raw: &[u8]) -> Result<(Vec<u8>, Vec<u8>), WecomError> {
    let plain = key
        .decryptor()
        .decrypt_padded_vec_mut::<NoPadding>(raw)
        .map_err(|_| WecomError::BadCiphertext("not whole AES blocks".into()))?;
    let unpadded = unpad(&plain)?;
    let (message, receiver) = split_layout(unpadded)?;
    Ok((message.to_vec(), receiver.to_vec()))
}

/// Strips PKCS#7 padding to a 32-byte block: the last byte is 1..=32 and so are the bytes it
/// covers.
fn unpad(plain: &[u8]) -> Result<&[u8], WecomError> {
    let bad = || WecomError::BadCiphertext("bad padding: wrong EncodingAESKey?".into());
    let pad = usize::from(*plain.last().ok_or_else(bad)?);
    if pad == 0 || pad > BLOCK || pad > plain.len() {
        return Err(bad());
    }
    let (body, padding) = plain.split_at(plain.len() - pad);
    if padding.iter().any(|&byte| usize::from(byte) != pad) {
        return Err(bad());
    }
    Ok(body)
}

/// `random(16) ‖ length(4) ‖ message ‖ receive id` → (message, receive id).
fn split_layout(unpadded: &[u8]) -> Result<(&[u8], &[u8]), WecomError> {
    if unpadded.len() < HEADER {
        return Err(WecomError::BadCiphertext(format!(
            "{} bytes is shorter than the random prefix and the length",
            unpadded.len()
        )));
    }
    let mut length = [0u8; 4];
    length.copy_from_slice(&unpadded[16..HEADER]);
    let length = u32::from_be_bytes(length) as usize;
    let rest = &unpadded[HEADER..];
    if length > rest.len() {
        return Err(WecomError::BadCiphertext(format!(
            "the message claims {length} bytes, only {} follow",
            rest.len()
        )));
    }
    Ok(rest.split_at(length))
}

/// Encrypts `message` for `receive_id` with the random prefix `random`, as the platform does
/// (and as a passive reply must be): base64 of AES-256-CBC over the padded layout.
pub fn encrypt(key: &AesKey, message: &[u8], receive_id: &str, random: [u8; 16]) -> String {
    let mut plain = Vec::with_capacity(HEADER + message.len() + receive_id.len() + BLOCK);
    plain.extend_from_slice(&random);
    plain.extend_from_slice(&(message.len() as u32).to_be_bytes());
    plain.extend_from_slice(message);
    plain.extend_from_slice(receive_id.as_bytes());
    let pad = BLOCK - plain.len() % BLOCK;
    plain.extend(std::iter::repeat_n(pad as u8, pad));
    STANDARD.encode(key.encryptor().encrypt_padded_vec_mut::<NoPadding>(&plain))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The official WeCom sample (Tencent's Sample.cs).
    const V1_TOKEN: &str = "QDG6eK";
    const V1_KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";
    const V1_CORP: &str = "wx5823bf96d3bd56c7";
    const V1_ENCRYPT: &str = "RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q==";
    const V1_PLAIN: &str = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName>\n<FromUserName><![CDATA[mycreate]]></FromUserName>\n<CreateTime>1409659813</CreateTime>\n<MsgType><![CDATA[text]]></MsgType>\n<Content><![CDATA[hello]]></Content>\n<MsgId>4561255354251345929</MsgId>\n<AgentID>218</AgentID>\n</xml>";

    /// wechatpy's work-crypto tests.
    const V2_TOKEN: &str = "123456";
    const V2_KEY: &str = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR";
    const V2_CORP: &str = "wx49f0ab532d5d035a";

    fn key(encoding: &str) -> AesKey {
        AesKey::from_encoding_aes_key(encoding).expect("a published key decodes")
    }

    /// The raw padded plaintext of a published ciphertext, to see its pad byte.
    fn pad_byte(key: &AesKey, ciphertext: &str) -> u8 {
        let raw = STANDARD.decode(ciphertext).expect("base64");
        let plain = key
            .decryptor()
            .decrypt_padded_vec_mut::<NoPadding>(&raw)
            .expect("blocks");
        *plain.last().expect("non-empty")
    }

    #[test]
    fn published_keys_with_trailing_bits_decode() {
        for encoding in [
            V1_KEY,
            V2_KEY,
            "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
        ] {
            assert!(
                STANDARD.decode(format!("{encoding}=")).is_err(),
                "a strict decoder refuses {encoding}"
            );
            key(encoding);
        }
        for bad in ["short", &"a".repeat(44), &format!("{}!", &V1_KEY[..42])] {
            let Err(WecomError::BadKey(message)) = AesKey::from_encoding_aes_key(bad) else {
                panic!("{bad:?} is not a key");
            };
            assert!(
                !message.contains('!') && !message.contains("33"),
                "{message}"
            );
        }
    }

    #[test]
    fn v1_url_verification() {
        let echostr = "P9nAzCzyDtyTWESHep1vC5X9xho/qYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp+4RPcs8TgAE7OaBO+FZXvnaqQ==";
        let parts = [V1_TOKEN, "1409659589", "263014780", echostr];
        assert_eq!(
            signature(&parts),
            "5c45ff5e21c57e6ad56bac8758b79b1d9ac89fd3"
        );
        assert!(verify("5C45FF5E21C57E6AD56BAC8758B79B1D9AC89FD3", &parts));
        let key = key(V1_KEY);
        assert_eq!(pad_byte(&key, echostr), 7);
        assert_eq!(
            decrypt(&key, echostr, V1_CORP).expect("decrypts"),
            b"1616140317555161061"
        );
    }

    #[test]
    fn v1_message_with_pad_byte_30() {
        let parts = [V1_TOKEN, "1409659813", "1372623149", V1_ENCRYPT];
        assert_eq!(
            signature(&parts),
            "477715d11cdb4164915debcba66cb864d751f3e6"
        );
        let key = key(V1_KEY);
        assert_eq!(pad_byte(&key, V1_ENCRYPT), 30);
        assert_eq!(
            decrypt(&key, V1_ENCRYPT, V1_CORP).expect("decrypts"),
            V1_PLAIN.as_bytes()
        );
        assert!(matches!(
            decrypt(&key, V1_ENCRYPT, "wx_other_corp"),
            Err(WecomError::WrongReceiver { .. })
        ));
    }

    #[test]
    fn v2_signatures_and_message_with_pad_byte_1() {
        let echostr = "4ByGGj+sVCYcvGeQYhaKIk1o0pQRNbRjxybjTGblXrBaXlTXeOo1+bXFXDQQb1o6co6Yh9Bv41n7hOchLF6p+Q==";
        let good = [V2_TOKEN, "1411443780", "437374425", echostr];
        assert!(verify("dd6b9c95b495b3f7e2901bfbc76c664930ffdb96", &good));
        let bad = [V2_TOKEN, "1411443780", "437374424", echostr];
        assert!(!verify("dd6b9c95b495b3f7e2901bfbc76c664930ffdb96", &bad));
        let key = key(V2_KEY);
        assert_eq!(
            decrypt(&key, echostr, V2_CORP).expect("echostr"),
            b"5927782489442352469"
        );
        let encrypt = "RgqEoJj5A4EMYlLvWO1F86ioRjZfaex/gePD0gOXTxpsq5Yj4GNglrBb8I2BAJVODGajiFnXBu7mCPatfjsu6IHCrsTyeDXzF6Bv283dGymzxh6ydJRvZsryDyZbLTE7rhnus50qGPMfp2wASFlzEgMW9z1ef/RD8XzaFYgm7iTdaXpXaG4+BiYyolBug/gYNx410cvkKR2/nPwBiT+P4hIiOAQqGp/TywZBtDh1yCF2KOd0gpiMZ5jSw3e29mTvmUHzkVQiMS6td7vXUaWOMZnYZlF3So2SjHnwh4jYFxdgpkHHqIrH/54SNdshoQgWYEvccTKe7FS709/5t6NMxuGhcUGAPOQipvWTT4dShyqio7mlsl5noTrb++x6En749zCpQVhDpbV6GDnTbcX2e8K9QaNWHp91eBdCRxthuL0=";
        assert!(verify(
            "74d92dfeb87ba7c714f89d98870ae5eb62dff26d",
            &[V2_TOKEN, "1411525903", "461056294", encrypt]
        ));
        assert_eq!(pad_byte(&key, encrypt), 1);
        let plain = decrypt(&key, encrypt, V2_CORP).expect("message");
        assert_eq!(
            String::from_utf8(plain).expect("utf8"),
            "<xml><ToUserName><![CDATA[wx49f0ab532d5d035a]]></ToUserName>\n<FromUserName><![CDATA[messense]]></FromUserName>\n<CreateTime>1411525903</CreateTime>\n<MsgType><![CDATA[text]]></MsgType>\n<Content><![CDATA[test]]></Content>\n<MsgId>4363689963896700987</MsgId>\n<AgentID>1</AgentID>\n</xml>"
        );
    }

    #[test]
    fn v2_reply_encryption() {
        let reply = "<xml>\n<MsgType><![CDATA[text]]></MsgType>\n<Content><![CDATA[test]]></Content>\n<FromUserName><![CDATA[wx49f0ab532d5d035a]]></FromUserName>\n<ToUserName><![CDATA[messense]]></ToUserName>\n<AgentID>1</AgentID>\n<CreateTime>1411525903</CreateTime>\n</xml>";
        let encrypted = encrypt(
            &key(V2_KEY),
            reply.as_bytes(),
            V2_CORP,
            *b"1234567890123456",
        );
        assert_eq!(
            encrypted,
            "9s4gMv99m88kKTh/H8IdkOiMg6bisoy3ypwy9H4hvSPe9nsGaqyw5hhSjdYbcrKk+j3nba4HMOTzHrluLBYqxgNcBqGsL8GqxlhZgURnAtObvesEl5nZ+uBE8bviY0LWke8Zy9V/QYKxNV2FqllNXcfmstttyIkMKCCmVbCFM2JTF5wY0nFhHZSjPUL2Q1qvSUCUld+/WIXrx0oyKQmpB6o8NRrrNrsDf03oxI1p9FxUgMnwKKZeOA/uu+2IEvEBtb7muXsVbwbgX05UPPJvFurDXafG0RQyPR+mf1nDnAtQmmNOuiR5MIkdQ39xn1vWwi1O5oazPoQJz0nTYjxxEE8kv3kFxtAGVRe3ypD3WeK2XeFYFMNMpatF9XiKzHo3"
        );
        assert_eq!(
            signature(&[V2_TOKEN, "1411525903", "461056294", &encrypted]),
            "407518b7649e86ef23978113f92d27afa9296533"
        );
    }

    #[test]
    fn official_account_vectors() {
        assert_eq!(
            signature(&["test", "1410685589", "test"]),
            "f21891de399b4e33a1a93c9a7b8a8fffb5a443ff"
        );
        let key = key("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG");
        let encrypted = encrypt(
            &key,
            "我是中文abcd123".as_bytes(),
            "wxb11529c136998cb6",
            *b"aaaabbbbccccdddd",
        );
        assert_eq!(
            encrypted,
            "jn1L23DB+6ELqJ+6bruv21Y6MD7KeIfP82D6gU39rmkgczbWwt5+3bnyg5K55bgVtVzd832WzZGMhkP72vVOfg=="
        );
        assert_eq!(
            decrypt(&key, &encrypted, "wxb11529c136998cb6").expect("decrypts"),
            "我是中文abcd123".as_bytes()
        );
    }

    #[test]
    fn broken_ciphertexts_are_errors_not_panics() {
        let key = key(V1_KEY);
        let mut cases: Vec<String> = vec![
            String::new(),
            "not base64!".into(),
            STANDARD.encode([0u8; 16]),
            STANDARD.encode([0u8; 33]),
            V1_ENCRYPT[..V1_ENCRYPT.len() - 24].to_owned() + "=",
        ];
        // Valid blocks whose padding or layout is wrong: zero pad, pad over 32, uneven pad,
        // a length beyond the message.
        for plain in [
            vec![0u8; 32],
            [vec![1u8; 31], vec![33]].concat(),
            [vec![1u8; 29], vec![2, 3, 3]].concat(),
            [vec![0u8; 16], vec![0, 0, 1, 0], vec![4u8; 12]].concat(),
        ] {
            cases
                .push(STANDARD.encode(key.encryptor().encrypt_padded_vec_mut::<NoPadding>(&plain)));
        }
        for case in cases {
            assert!(
                matches!(
                    decrypt(&key, &case, V1_CORP),
                    Err(WecomError::BadCiphertext(_))
                ),
                "{case:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn round_trips_with_any_key_message_and_receiver(
            key_bytes in proptest::array::uniform32(any::<u8>()),
            message in proptest::collection::vec(any::<u8>(), 0..300),
            receiver in "[a-z0-9]{0,20}",
            random in proptest::array::uniform16(any::<u8>()),
        ) {
            let encoding = STANDARD.encode(key_bytes);
            let key = AesKey::from_encoding_aes_key(&encoding[..43]).expect("key");
            prop_assert_eq!(key.0, key_bytes);
            let sealed = encrypt(&key, &message, &receiver, random);
            prop_assert_eq!(STANDARD.decode(&sealed).expect("base64").len() % 32, 0);
            prop_assert_eq!(decrypt(&key, &sealed, &receiver).expect("opens"), message);
        }
    }
}
