//! Every fuzz target over its seed corpus and every saved crash (`fuzz/corpus/<target>`,
//! `fuzz/regressions/<target>`): what once crashed stays fixed.

use std::path::PathBuf;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut found = Vec::new();
    for folder in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(folder).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() {
                let bytes = std::fs::read(&path).expect("read input");
                found.push((path, bytes));
            }
        }
    }
    found
}

#[test]
fn every_target_survives_its_corpus_and_past_crashes() {
    for (name, target) in oncegate_fuzzing::TARGETS {
        let inputs = inputs(name);
        assert!(!inputs.is_empty(), "no seed corpus for {name}");
        for (path, bytes) in inputs {
            let outcome = std::panic::catch_unwind(|| target(&bytes));
            assert!(outcome.is_ok(), "{name} fails on {}", path.display());
        }
    }
}
