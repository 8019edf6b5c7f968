//! libFuzzer driver for `oncegate_fuzzing::keys_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::keys_body(data));
