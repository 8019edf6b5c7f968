//! libFuzzer driver for `oncegate_fuzzing::feishu_ws_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::feishu_ws_frames(data));
