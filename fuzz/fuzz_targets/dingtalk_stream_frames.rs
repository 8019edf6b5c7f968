//! libFuzzer driver for `oncegate_fuzzing::dingtalk_stream_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::dingtalk_stream_frames(data));
