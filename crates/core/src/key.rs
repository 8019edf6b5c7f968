//! Namespaced keys, stored as 128-bit hashes.
//!
//! A key is the tuple (source, app, kind, id). Hashing it with length prefixes means that no two
//! different tuples share an encoding, so tenants (apps) can never collide, and 128 bits make an
//! accidental collision among 10^12 keys less likely than 10^-14.

use std::fmt;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{Xxh3Default, xxh3_128};

/// The identity of one dedup key, watermark scope or business key: a 128-bit hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyHash(pub [u8; 16]);

impl KeyHash {
    /// Hashes the parts of a key; each part is length-prefixed so that part boundaries count.
    pub fn of(parts: &[&str]) -> Self {
        // Typical keys fit on the stack and hash in one pass; the streaming hasher gives the
        // same digest for longer ones.
        const STACK: usize = 256;
        let encoded: usize = parts.iter().map(|p| 8 + p.len()).sum();
        if encoded <= STACK {
            let mut buffer = [0u8; STACK];
            let mut at = 0;
            for part in parts {
                buffer[at..at + 8].copy_from_slice(&(part.len() as u64).to_le_bytes());
                at += 8;
                buffer[at..at + part.len()].copy_from_slice(part.as_bytes());
                at += part.len();
            }
            return Self(xxh3_128(&buffer[..at]).to_le_bytes());
        }
        let mut hasher = Xxh3Default::new();
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        Self(hasher.digest128().to_le_bytes())
    }

    /// The low 64 bits, already uniformly distributed: use them to pick shards and partitions.
    pub fn low64(&self) -> u64 {
        let mut low = [0u8; 8];
        low.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(low)
    }

    /// The high 64 bits.
    pub fn high64(&self) -> u64 {
        let mut high = [0u8; 8];
        high.copy_from_slice(&self.0[8..]);
        u64::from_le_bytes(high)
    }

    /// The identity of this key's record in `partition`: records live in partitions (every key
    /// of an event in the event's partition), so that one Redis Cluster slot holds all an
    /// event's state. Partition 0 leaves the key as it is.
    pub fn in_partition(&self, partition: u16) -> Self {
        // Keys are uniform 128-bit hashes: xor-ing a distinct odd multiple per partition keeps
        // (key, partition) pairs as collision-free as keys are.
        const MIX: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835;
        let mixed = u128::from_le_bytes(self.0) ^ MIX.wrapping_mul(u128::from(partition));
        Self(mixed.to_le_bytes())
    }

    /// The partition of a business key that no event brought in (claimed directly, never
    /// admitted): derived from the key alone, so every caller finds the same record.
    pub fn home(&self, partitions: u16) -> u16 {
        partition_of(self.low64(), partitions)
    }

    /// Parses the 32-character hex form that `Display` prints.
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.trim();
        // Only hex digits: `from_str_radix` alone would also take a sign ("+0").
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(bytes))
    }
}

impl KeyHash {
    /// The 32 lowercase hex digits that name the key, on the stack.
    pub fn hex_digits(&self) -> [u8; 32] {
        let mut hex = [0u8; 32];
        hex_into(&self.0, &mut hex);
        hex
    }

    /// The idempotency id of the key's deliveries, `msg_` and its hex digits, on the stack:
    /// every delivery names one.
    pub fn delivery_id(&self) -> DeliveryId {
        let mut id = *b"msg_00000000000000000000000000000000";
        id[4..].copy_from_slice(&self.hex_digits());
        DeliveryId(id)
    }
}

/// Writes the lowercase hex digits of `bytes` into `out` (twice as long; what does not fit is
/// left out), without allocating: keys and signatures are written on every request.
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

/// The id of an event its platform sends without one, made of a SHA-256 `digest` of what
/// identifies it: `fp-` and the digest's first 16 bytes in hex. Every source names such events
/// alike, so that an operator reads one form.
///
/// ```
/// let digest = [0xab; 32];
/// assert_eq!(oncegate_core::fingerprint_id(&digest), format!("fp-{}", "ab".repeat(16)));
/// ```
pub fn fingerprint_id(digest: &[u8; 32]) -> String {
    let mut out = *b"fp-00000000000000000000000000000000";
    hex_into(&digest[..16], &mut out[3..]);
    // Only ASCII went in.
    String::from_utf8_lossy(&out).into_owned()
}

/// `msg_` and a key's 32 hex digits: the id a sink names a delivery by.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DeliveryId([u8; 36]);

impl DeliveryId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII went in.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for KeyHash {
    /// 32 lowercase hex digits, written at once: every delivery and Redis key names one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex_digits();
        // Only ASCII digits went in.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({self})")
    }
}

/// The partition of a hash (an event's order hash, a key's low bits) among `partitions` (at
/// least one).
pub fn partition_of(hash: u64, partitions: u16) -> u16 {
    (hash % u64::from(partitions.max(1))) as u16
}

/// The key of one identifier of kind `kind` (e.g. `event_id`, `message_id`) from `source`/`app`.
pub fn key_for(source: &str, app: &str, kind: &str, id: &str) -> KeyHash {
    KeyHash::of(&[source, app, kind, id])
}

/// The key of a message by its platform id *and its sender*, for platforms whose message ids
/// repeat across senders (WeCom's and WeChat's `MsgId`, an AI bot's `msgid`): what admission
/// records and what an operator looks a message up by.
pub fn sender_key(source: &str, app: &str, kind: &str, id: &str, from: &str) -> KeyHash {
    KeyHash::of(&[source, app, kind, id, from])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_id_is_msg_and_the_keys_hex() {
        let mut bytes = [0u8; 16];
        bytes[0] = 0xab;
        bytes[15] = 0x09;
        let key = KeyHash(bytes);
        assert_eq!(key.to_string(), "ab000000000000000000000000000009");
        assert_eq!(
            key.delivery_id().as_str(),
            "msg_ab000000000000000000000000000009"
        );
        let other = KeyHash::of(&["feishu", "cli_a", "event_id", "ev_1"]);
        assert_eq!(other.delivery_id().as_str(), format!("msg_{other}"));
    }

    #[test]
    fn part_boundaries_are_part_of_the_key() {
        assert_ne!(KeyHash::of(&["ab", "c"]), KeyHash::of(&["a", "bc"]));
        assert_ne!(KeyHash::of(&["abc"]), KeyHash::of(&["abc", ""]));
    }

    #[test]
    fn long_keys_hash_as_short_ones_do() {
        let long = "x".repeat(300);
        let mut hasher = Xxh3Default::new();
        for part in ["feishu", long.as_str()] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        assert_eq!(
            KeyHash::of(&["feishu", &long]).0,
            hasher.digest128().to_le_bytes()
        );
        let mut hasher = Xxh3Default::new();
        for part in ["a", "b"] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        assert_eq!(KeyHash::of(&["a", "b"]).0, hasher.digest128().to_le_bytes());
    }

    #[test]
    fn apps_never_share_keys() {
        assert_ne!(
            key_for("feishu", "cli_a", "event_id", "e1"),
            key_for("feishu", "cli_b", "event_id", "e1")
        );
        assert_ne!(
            key_for("feishu", "cli_a", "event_id", "e1"),
            key_for("wecom", "cli_a", "event_id", "e1")
        );
        assert_eq!(
            key_for("feishu", "cli_a", "event_id", "e1"),
            key_for("feishu", "cli_a", "event_id", "e1")
        );
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let key = key_for("feishu", "app", "event_id", "x");
        assert_eq!(KeyHash::from_hex(&key.to_string()), Some(key));
        let bytes = [
            0x00, 0x01, 0x0f, 0x10, 0x7f, 0x80, 0xab, 0xff, 9, 10, 11, 12, 13, 14, 15, 16,
        ];
        assert_eq!(
            KeyHash(bytes).to_string(),
            "00010f107f80abff090a0b0c0d0e0f10"
        );
        assert_eq!(KeyHash::from_hex("zz"), None);
        assert_eq!(KeyHash::from_hex(&"g".repeat(32)), None);
        assert_eq!(KeyHash::from_hex(&"é".repeat(16)), None);
        assert_eq!(KeyHash::from_hex(&format!("+0{}", "0".repeat(30))), None);
    }
}
