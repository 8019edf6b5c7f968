//! libFuzzer driver for `oncegate_fuzzing::replay_stamp`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::replay_stamp(data));
