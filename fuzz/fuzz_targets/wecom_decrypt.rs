//! libFuzzer driver for `oncegate_fuzzing::wecom_decrypt`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::wecom_decrypt(data));
