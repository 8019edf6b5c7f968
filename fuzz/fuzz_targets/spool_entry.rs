//! libFuzzer driver for `oncegate_fuzzing::spool_entry`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::spool_entry(data));
