//! A hasher for keys that are already uniform hashes: it passes their 64 bits through instead of
//! hashing them again.

use std::hash::{BuildHasherDefault, Hasher};

/// Passes a `u64` through; bytes are folded, for the rare key that is not a `u64`.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// The `BuildHasher` of [`PassThrough`].
pub type BuildPassThrough = BuildHasherDefault<PassThrough>;
