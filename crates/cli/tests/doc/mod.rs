//! The README as a reader finds things in it: a table of contents in reading order whose links
//! all land, every section where its title says, and the sections the binary's messages cite.

use std::collections::BTreeSet;
use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
        .expect("README")
}

/// Lines outside code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped (letters of any script kept),
/// spaces as hyphens.
fn anchor(title: &str) -> String {
    title
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The `## ` and `### ` headings, in order: (level, title).
fn headings(text: &str) -> Vec<(usize, String)> {
    prose(text)
        .into_iter()
        .filter_map(|line| {
            let level = line.chars().take_while(|c| *c == '#').count();
            ((2..=3).contains(&level) && line[level..].starts_with(' '))
                .then(|| (level, line[level + 1..].to_owned()))
        })
        .collect()
}

/// The text of the `## title` section, up to the next `## `.
fn section(text: &str, title: &str) -> String {
    let start = text
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section {title:?}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |at| at + 3);
    rest[..end].to_owned()
}

#[test]
fn the_readme_has_contents_in_reading_order_and_every_link_lands() {
    let text = readme();
    let heads = headings(&text);
    let anchors: BTreeSet<String> = heads.iter().map(|(_, title)| anchor(title)).collect();
    // Every in-page link lands on a heading.
    let mut rest = text.as_str();
    let mut links = 0;
    while let Some(at) = rest.find("](#") {
        let target = &rest[at + 3..];
        let end = target.find(')').expect("a closed link");
        assert!(
            anchors.contains(&target[..end]),
            "a link to #{} lands on no heading",
            &target[..end]
        );
        links += 1;
        rest = &target[end..];
    }
    // The contents name every section once, in the document's order, grouped in the order a
    // user reads in.
    let contents = section(&text, "Contents");
    let listed: Vec<String> = contents
        .match_indices("](#")
        .map(|(at, _)| {
            let target = &contents[at + 3..];
            target[..target.find(')').expect("closed")].to_owned()
        })
        .collect();
    let top: Vec<String> = heads
        .iter()
        .filter(|(level, title)| *level == 2 && title != "Contents")
        .map(|(_, title)| anchor(title))
        .collect();
    let listed_top: Vec<&String> = listed.iter().filter(|a| top.contains(a)).collect();
    assert_eq!(
        listed_top,
        top.iter().collect::<Vec<_>>(),
        "the contents list every section once, in order"
    );
    assert!(links > listed.len(), "links beyond the contents");
    let groups: Vec<&str> = contents
        .lines()
        .filter_map(|line| line.strip_prefix("- **")?.split_once("**").map(|(g, _)| g))
        .collect();
    assert_eq!(
        groups,
        [
            "Start",
            "Platforms",
            "Routes, sends and keys",
            "Operating",
            "Installing",
            "Library",
            "Reference",
            "Contributing"
        ]
    );
}

#[test]
fn each_section_holds_what_its_title_says() {
    let text = readme();
    let platforms = section(&text, "Platforms");
    for elsewhere in [
        "sink = \"kafka\"",
        "**Card callbacks**",
        "Upgrading",
        "retry_schedule",
    ] {
        assert!(
            !platforms.contains(elsewhere),
            "{elsewhere:?} belongs in another section than Platforms"
        );
    }
    let routes = section(&text, "Routes and sinks");
    for here in ["sink = \"kafka\"", "**Card callbacks**", "retry_schedule"] {
        assert!(routes.contains(here), "{here:?} in Routes and sinks");
    }
    assert!(section(&text, "Upgrading").contains("envelope said `source`"));
    // A `/send` example names its caller where it shows it.
    assert!(section(&text, "Sending once").contains("[[api.caller]]"));
    // A step puts the binary on PATH before commands call it `oncegate`.
    let start = section(&text, "Two commands");
    assert!(start.contains("cargo install --path crates/cli"), "{start}");
    // The service steps install the unit they then enable.
    let service = section(&text, "Installing it as a service");
    assert!(
        service.contains("packaging/oncegate.service /etc/systemd/system/oncegate.service")
            && service.contains("systemctl enable --now oncegate"),
        "{service}"
    );
    // The dashboard is set up as its JSON asks: a data source variable, no import prompt.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grafana/oncegate.json"),
        )
        .expect("dashboard"),
    )
    .expect("JSON");
    assert!(dashboard.get("__inputs").is_none());
    assert_eq!(
        dashboard["templating"]["list"][0]["type"], "datasource",
        "{dashboard}"
    );
    assert!(section(&text, "Operating it").contains("`datasource` variable"));
    // Gateways are told apart: an `instance` variable, and every query keeps to it.
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    assert!(
        variables.iter().any(|v| v["name"] == "instance"),
        "{variables:?}"
    );
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            assert_eq!(
                expr.matches("oncegate_").count(),
                expr.matches("instance=~\"$instance\"").count(),
                "{expr}"
            );
        }
    }
}

/// Sections the code's messages cite (`README "Title"`) exist.
#[test]
fn every_section_a_message_cites_exists() {
    let text = readme();
    let titles: BTreeSet<String> = headings(&text).into_iter().map(|(_, t)| t).collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cited = 0;
    let mut folders = vec![root.join("crates")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                if !path.ends_with("target") && !path.ends_with("tests") {
                    folders.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("source");
            for (at, _) in source.match_indices("README \\\"") {
                let rest = &source[at + "README \\\"".len()..];
                let title = &rest[..rest.find("\\\"").expect("a closed title")];
                assert!(
                    titles.contains(title),
                    "{} cites README \"{title}\", which has no such section",
                    path.display()
                );
                cited += 1;
            }
        }
    }
    assert!(cited > 0, "the configuration's warning cites a section");
}
