//! The code's shape, kept: no module of the gateway imports one that imports it back, and no
//! production file of the workspace grows past ~600 lines (its test module aside).
//!
//! Edges are the `crate::…` paths a module names outside its tests, each resolved to the
//! longest module it reaches (`crate::api::keys::claim` is `api::keys`). The crate root is left
//! out: it declares every module and holds the state they share.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MOST_LINES: usize = 600;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's text before its test module.
fn production(text: &str) -> &str {
    text.find("\n#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at])
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn no_production_file_is_longer_than_the_bound() {
    let root = workspace();
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates"))
        .expect("crates")
        .flatten()
    {
        rust_files(&krate.path().join("src"), &mut files);
    }
    let mut long = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let lines = production(&text).lines().count();
        let name = file
            .strip_prefix(&root)
            .expect("in the workspace")
            .to_string_lossy()
            .replace('\\', "/");
        if lines > MOST_LINES {
            long.insert((name, lines));
        }
    }
    assert!(
        long.is_empty(),
        "over {MOST_LINES} lines: {long:?} — split them along their concerns"
    );
    // The walk sees the workspace: the gateway's own files are among those counted.
    assert!(
        files.iter().any(|f| f.ends_with("gateway/src/lib.rs")),
        "{files:?}"
    );
}

/// Each module's name (`api::keys`) and its production source.
fn modules() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(&src).expect("in src").with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|last| last == "mod") {
                parts.pop();
            }
            let name = if parts == ["lib"] {
                String::new()
            } else {
                parts.join("::")
            };
            let text = std::fs::read_to_string(&file).expect("read");
            (name, production(&text).to_owned())
        })
        .collect()
}

/// The `crate::…` paths in `text`, braces expanded one level (`crate::{a::b, c}`).
fn crate_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            paths.extend(inner.split(',').map(|p| p.trim().to_owned()));
        } else {
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            paths.push(path);
        }
    }
    paths
}

#[test]
fn no_gateway_module_imports_one_that_imports_it_back() {
    let modules = modules();
    let resolve = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        (1..=parts.len())
            .rev()
            .map(|n| parts[..n].join("::"))
            .find(|name| modules.contains_key(name))
    };
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (name, text) in &modules {
        let reached = edges.entry(name).or_default();
        for path in crate_paths(text) {
            if let Some(target) = resolve(&path)
                && target != *name
            {
                reached.insert(target);
            }
        }
    }
    // A module that reaches itself through others is in a circle.
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = edges[start].iter().cloned().collect();
        while let Some(next) = todo.pop() {
            if next == *start {
                circles.push(start.to_string());
                break;
            }
            if seen.insert(next.clone())
                && let Some(more) = edges.get(next.as_str())
            {
                todo.extend(more.iter().cloned());
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules in an import circle: {circles:?}"
    );
    // The check sees edges: the dispatcher reaches the sinks.
    assert!(edges["dispatch"].contains("sink"), "{edges:?}");
}

/// What names a platform in code: its receiving or transport crates (`oncegate_feishu` covers
/// `oncegate_feishu_ws`), the configuration's platform variants, and the platforms' names as
/// strings an event's `platform` is compared with.
const PLATFORM_NAMES: &[&str] = &[
    "oncegate_feishu",
    "oncegate_wecom",
    "oncegate_dingtalk",
    "oncegate_webhook",
    "PlatformConfig::",
    "\"feishu\"",
    "\"lark\"",
    "\"wecom\"",
    "\"wechat\"",
    "\"dingtalk\"",
];

/// `text` without its comment lines (a comment may say which platform does what) and with its
/// features' names unquoted (a build may leave a platform out).
fn code(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("feature = \"", "feature = ")
}

#[test]
fn no_module_outside_the_registry_names_a_platform() {
    let modules = modules();
    let mut named = BTreeSet::new();
    for (name, text) in &modules {
        if name == "registry" || name.starts_with("registry::") {
            continue;
        }
        let code = code(text);
        for platform in PLATFORM_NAMES {
            if code.contains(platform) {
                named.insert(format!("{name}: {platform}"));
            }
        }
    }
    assert!(
        named.is_empty(),
        "{named:?}: a platform is a crate and an entry in registry/ (its receiver, its long \
         connection's Transport, its sender); the rest of the gateway holds them alike"
    );
    // The check sees what it looks for: the registry names every platform.
    let registry = code(&modules["registry"]);
    assert!(
        [
            "PlatformConfig::Feishu",
            "PlatformConfig::WecomAibot",
            "PlatformConfig::Dingtalk"
        ]
        .iter()
        .all(|variant| registry.contains(variant)),
        "the registry's text was not read"
    );
}
