//! libFuzzer driver for `oncegate_fuzzing::aibot_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::aibot_frames(data));
