//! libFuzzer driver for `oncegate_fuzzing::wecom_template`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::wecom_template(data));
