//! libFuzzer driver for `oncegate_fuzzing::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::config(data));
