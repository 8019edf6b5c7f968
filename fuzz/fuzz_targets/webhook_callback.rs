//! libFuzzer driver for `oncegate_fuzzing::webhook_callback`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::webhook_callback(data));
