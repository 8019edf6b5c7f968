//! libFuzzer driver for `oncegate_fuzzing::journal_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oncegate_fuzzing::journal_file(data));
