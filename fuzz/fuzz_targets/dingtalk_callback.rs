//! libFuzzer driver for `oncegate_fuzzing::dingtalk_callback`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::dingtalk_callback(data));
