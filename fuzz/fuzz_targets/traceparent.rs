//! libFuzzer driver for `oncegate_fuzzing::traceparent`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::traceparent(data));
