//! libFuzzer driver for `oncegate_fuzzing::feishu_envelope`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::feishu_envelope(data));
