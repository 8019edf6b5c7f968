//! The benchmark and packaging scripts find cargo's builds where cargo puts them: under
//! `CARGO_TARGET_DIR` when it is set, not in a `target/` that may not exist.

use std::path::Path;
use std::process::Command;

fn repository() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn the_scripts_build_folder_is_cargos() {
    let elsewhere = tempfile::tempdir().expect("dir");
    let output = Command::new("bash")
        .current_dir(repository())
        .args([
            "-c",
            "source scripts/bench-common && printf %s \"$target_dir\"",
        ])
        .env("CARGO_TARGET_DIR", elsewhere.path())
        .output()
        .expect("bash");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        elsewhere.path().to_string_lossy()
    );
    // No script names the default folder itself.
    for entry in std::fs::read_dir(repository().join("scripts")).expect("scripts") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = line.split('#').next().unwrap_or("");
            assert!(
                !code.contains("target/release") && !code.contains("-p target "),
                "{}:{}: {line}",
                path.display(),
                n + 1
            );
        }
    }
}
