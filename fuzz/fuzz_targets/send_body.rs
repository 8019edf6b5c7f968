//! libFuzzer driver for `oncegate_fuzzing::send_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::send_body(data));
