//! Every platform through the real binary: `oncegate serve` with a WeCom corp, a WeChat
//! Official Account and a DingTalk app (the keys of DingTalk's official vector) beside a Feishu
//! app, and `oncegate simulate` sending as each (fresh signatures for platform retries,
//! byte-for-byte replays): each event is delivered once.

use std::collections::HashSet;

use crate::support;

use support::{Serve, client, file_route, lines, oncegate};

const AES_KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";

fn config(dir: &std::path::Path) -> String {
    format!(
        r#"
[store]
backend = "memory"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[[source]]
name = "corp"
platform = "wecom"
corp_id = "ww_e2e"
agent_id = "1000002"
token = "corp-token"
encoding_aes_key = "{AES_KEY}"

[[source]]
name = "corp2"
platform = "wecom"
corp_id = "ww_e2e2"
token = "corp2-token"
encoding_aes_key = "{AES_KEY}"

[[source]]
name = "oa"
platform = "wechat"
app_id = "wx_e2e"
token = "oa-token"
encoding_aes_key = "{AES_KEY}"

[[source]]
name = "ding"
platform = "dingtalk"
app_key = "ding6ccabc44d2c8d38b"
token = "mryue"
aes_key = "Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7"

[[source]]
name = "bot"
platform = "feishu"
app_id = "cli_e2e"
encrypt_key = "feishu-key"
verification_token = "feishu-token"

[[route]]
events = ["event.change_external_chat*"]
sink = "file"
path = "{}"
watermark = true

{}
"#,
        dir.join("out/members.jsonl").display(),
        file_route(dir, "")
    )
}

/// Runs `oncegate simulate` as `source` against `serve` with `extra` arguments; its summary.
fn simulate(serve: &Serve, dir: &std::path::Path, source: &str, extra: &[&str]) -> String {
    let output = oncegate()
        .args([
            "simulate",
            "--quiet",
            "--concurrency",
            "16",
            "--source",
            source,
        ])
        .args(extra)
        .arg("--config")
        .arg(dir.join("oncegate.toml"))
        .arg("--url")
        .arg(&serve.base)
        .arg("--admin")
        .arg(&serve.admin)
        .output()
        .expect("simulate");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{source}: {text} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// A figure of `simulate`'s summary (`delivered          300`).
fn figure(output: &str, name: &str) -> u64 {
    output
        .lines()
        .find(|line| line.starts_with(name))
        .and_then(|line| line.split_whitespace().find_map(|word| word.parse().ok()))
        .unwrap_or_else(|| panic!("no {name:?} in {output}"))
}

#[test]
fn each_platforms_events_are_delivered_once_through_the_binary() {
    let dir = tempfile::tempdir().expect("dir");
    let serve = Serve::start_with(dir.path(), &config(dir.path()));
    let mut expected = 0;
    for source in ["corp", "oa", "bot"] {
        let text = simulate(
            &serve,
            dir.path(),
            source,
            &[
                "--events",
                "300",
                "--duplicates",
                "0.3",
                "--replays",
                "0.05",
            ],
        );
        assert_eq!(figure(&text, "admitted"), 300, "{source}: {text}");
        assert_eq!(figure(&text, "delivered"), 300, "{source}: {text}");
        assert!(figure(&text, "duplicates dropped") > 0, "{source}: {text}");
        // The gateway's count: WeCom and WeChat replays are answered 200, as duplicates.
        assert!(figure(&text, "replays rejected") > 0, "{source}: {text}");
        expected += 300;
    }
    // DingTalk signs no window: a byte-for-byte replay is a duplicate of its event id,
    // answered with the encrypted success like a platform retry.
    let text = simulate(
        &serve,
        dir.path(),
        "ding",
        &[
            "--events",
            "300",
            "--duplicates",
            "0.3",
            "--replays",
            "0.05",
        ],
    );
    assert_eq!(figure(&text, "admitted"), 300, "ding: {text}");
    assert_eq!(figure(&text, "delivered"), 300, "ding: {text}");
    assert!(figure(&text, "duplicates dropped") > 0, "ding: {text}");
    expected += 300;
    // A file whose secrets are not the gateway's: every request refused 401, said as such.
    let other = dir.path().join("other.toml");
    std::fs::write(
        &other,
        config(dir.path()).replace("feishu-key", "another-key"),
    )
    .expect("write");
    let output = oncegate()
        .args(["simulate", "--quiet", "--events", "20", "--source", "bot"])
        .arg("--config")
        .arg(&other)
        .args(["--url", &serve.base, "--admin", &serve.admin])
        .output()
        .expect("simulate");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{said}");
    assert!(
        said.contains("every request was refused 401") && said.contains("not the gateway's"),
        "{said}"
    );
    let delivered = lines(dir.path());
    assert_eq!(delivered.len(), expected, "{}", serve.stderr());
    let distinct: HashSet<(String, String)> = delivered
        .iter()
        .map(|line| {
            (
                line["platform"].as_str().unwrap_or_default().to_owned(),
                line["event_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(distinct.len(), expected, "an event was delivered twice");
    for (source, app) in [
        ("wecom", "ww_e2e"),
        ("wechat", "wx_e2e"),
        ("feishu", "cli_e2e"),
        ("dingtalk", "ding6ccabc44d2c8d38b"),
    ] {
        assert_eq!(
            delivered
                .iter()
                .filter(|line| line["platform"] == source && line["app"] == app)
                .count(),
            300,
            "{source}"
        );
    }
    // Callbacks are counted by source, platform and answer.
    let metrics = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            let response = client()
                .get(format!("{}/metrics", serve.admin))
                .send()
                .await
                .expect("metrics");
            response.text().await.expect("text")
        });
    for (source, platform) in [("corp", "wecom"), ("oa", "wechat"), ("bot", "feishu")] {
        let line = metrics
            .lines()
            .find(|line| {
                line.starts_with("oncegate_callbacks_total{")
                    && line.contains(&format!("source=\"{source}\""))
                    && line.contains(&format!("platform=\"{platform}\""))
                    && line.contains("status=\"200\"")
            })
            .unwrap_or_else(|| panic!("no 200s counted for {source}: {metrics}"));
        let count: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a count");
        assert!(count >= 300.0, "{line}");
    }
    // An operator finds a WeCom message by the MsgId and sender they have, with `inspect`.
    let wecom = delivered
        .iter()
        .find(|line| line["platform"] == "wecom" && line["event_type"] == "message.text")
        .expect("a WeCom text message");
    let xml = wecom["payload"].as_str().unwrap_or_default();
    let field = |name: &str| {
        let (_, rest) = xml.split_once(&format!("<{name}>")).expect(name);
        let (value, _) = rest.split_once(&format!("</{name}>")).expect(name);
        value
            .trim_start_matches("<![CDATA[")
            .trim_end_matches("]]>")
            .to_owned()
    };
    let (msg_id, from) = (field("MsgId"), field("FromUserName"));
    let inspect = |from: &str| {
        let output = oncegate()
            .args([
                "inspect",
                "--admin",
                &serve.admin,
                "record",
                "--platform",
                "wecom",
            ])
            .args(["--app", "ww_e2e", "--id", &msg_id, "--from", from])
            .output()
            .expect("inspect");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let found = inspect(&from);
    assert!(
        found.contains("state        pending") && found.contains("admitted"),
        "{found}"
    );
    assert!(inspect("someone-else").contains("not seen"));
}

#[test]
fn member_changes_of_two_corps_out_of_order_keep_their_order_through_the_binary() {
    let dir = tempfile::tempdir().expect("dir");
    let serve = Serve::start_with(dir.path(), &config(dir.path()));
    let text = simulate(
        &serve,
        dir.path(),
        "corp,corp2",
        &[
            "--membership",
            "--events",
            "1000",
            "--chats",
            "7",
            "--duplicates",
            "0.2",
        ],
    );
    assert_eq!(figure(&text, "admitted"), 1000, "{text}");
    let delivered = figure(&text, "delivered");
    let stale = figure(&text, "dropped as stale");
    assert_eq!(delivered + stale, 1000, "{text}");
    // 500 pairs a second apart, none stamped in the future (beyond the gateway's 5-minute skew
    // they would be taken as forgeries, and lift the chats' watermarks ahead of the clock).
    let (_, metrics) = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(serve.admin_get("/metrics"));
    let future = metrics
        .lines()
        .find_map(|line| line.strip_prefix("oncegate_future_creation_times_total "))
        .unwrap_or("0");
    assert_eq!(future, "0", "{metrics}");
    assert!(stale > 0, "half the pairs arrive leave first: {text}");
    // Per member: a join is never delivered after its leave.
    let members = std::fs::read_to_string(dir.path().join("out/members.jsonl")).expect("lines");
    let mut left = HashSet::new();
    for line in members.lines() {
        let line: serde_json::Value = serde_json::from_str(line).expect("json");
        let payload = line["payload"].as_str().unwrap_or_default();
        let member = payload
            .split("<Item><![CDATA[")
            .nth(1)
            .and_then(|rest| rest.split("]]>").next())
            .expect("member")
            .to_owned();
        if payload.contains("del_member") {
            left.insert(member);
        } else {
            assert!(!left.contains(&member), "{member} joined after leaving");
        }
    }
    assert_eq!(members.lines().count() as u64, delivered);
    // Two corps, the same chat ids: each corp's share arrived under its own app.
    for corp in ["\"app\":\"ww_e2e\"", "\"app\":\"ww_e2e2\""] {
        let n = members.lines().filter(|l| l.contains(corp)).count();
        assert!(n > 50, "{corp}: {n} of {delivered}");
    }
}
