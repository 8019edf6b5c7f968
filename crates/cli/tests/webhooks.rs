//! Generic webhook sources through the binary (`platform = "webhook"`): Slack, GitHub and
//! Standard Webhooks presets with requests signed by code that is not ours (Slack's own SDK,
//! slack_sdk's `SignatureVerifier`; Python's `hmac` as GitHub's docs write it; the Standard
//! Webhooks library itself; PyNaCl for Discord's
//! Ed25519; DingTalk's robot `sign` as its documentation's snippet computes it), Telegram's token,
//! and the seeds' third-party gateways (wkteam unsigned — said at risk —, xingyapi with a URL
//! secret). Ten copies of one event at once are delivered once, each answered 200; a forged
//! or stale request is refused and delivers nothing; handshakes are answered.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::{self, Serve, client, file_route, lines, oncegate};

const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// RFC 8032's first key pair: PyNaCl signs with the seed, the source holds the public key.
const DISCORD_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const DINGTALK_ROBOT_SECRET: &str = "SECtest-robot-secret";
const DISCORD_PUBLIC_KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

fn config(dir: &std::path::Path) -> String {
    format!(
        r#"
[store]
backend = "memory"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[[source]]
name = "slack"
platform = "webhook"
preset = "slack"
app_id = "A0SLACK"
secret = "{SLACK_SECRET}"

[[source]]
name = "github"
platform = "webhook"
preset = "github"
secret = "{GITHUB_SECRET}"

[[source]]
name = "svix"
platform = "webhook"
preset = "standard-webhooks"
secret = "{STANDARD_SECRET}"

[[source]]
name = "telegram"
platform = "webhook"
preset = "telegram"
app_id = "123456"
secret = "tg-secret_token"

[[source]]
name = "discord"
platform = "webhook"
preset = "discord"
app_id = "app1"
secret = "{DISCORD_PUBLIC_KEY}"

[[source]]
name = "dingrobot"
platform = "webhook"
preset = "dingtalk-robot"
app_id = "dingrobotkey"
secret = "{DINGTALK_ROBOT_SECRET}"

[[source]]
name = "wkteam"
platform = "webhook"
preset = "wkteam"
verify = "none"

[[source]]
name = "xingyapi"
platform = "webhook"
preset = "xingyapi"
verify = "token"
signature = "query:key"
secret = "url-secret-123"

{}
"#,
        file_route(dir, "")
    )
}

/// What `script` (Python) prints for `args`.
fn python(script: &str, args: &[&str]) -> String {
    let output = Command::new(crate::clients::python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

const HMAC_HEX: &str = "import hmac, hashlib, sys; \
    print(hmac.new(sys.argv[1].encode(), sys.argv[2].encode(), hashlib.sha256).hexdigest())";

/// A Slack request's signature as Slack's own SDK makes it (slack_sdk's `SignatureVerifier`).
const SLACK_SIGN: &str = "import sys; from slack_sdk.signature import SignatureVerifier; \
    print(SignatureVerifier(sys.argv[1]).generate_signature(timestamp=sys.argv[2], \
    body=sys.argv[3]))";

/// DingTalk's robot `sign` as its documentation computes it.
const DINGTALK_SIGN: &str = "import hmac, hashlib, base64, sys; \
    ts, secret = sys.argv[1], sys.argv[2]; \
    print(base64.b64encode(hmac.new(secret.encode(), f'{ts}\\n{secret}'.encode(), \
    hashlib.sha256).digest()).decode())";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_secs()
}

/// Posts `body` with `headers` to `/webhook/<source>?<query>` `copies` times at once: the
/// statuses.
async fn post(
    serve: &Serve,
    source: &str,
    query: &str,
    headers: &[(String, String)],
    body: &str,
    copies: usize,
) -> Vec<(u16, String)> {
    let client = client();
    let url = format!("{}/webhook/{source}{query}", serve.base);
    let sends = (0..copies).map(|_| {
        let mut request = client.post(&url).body(body.to_owned());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move {
            let answer = request.send().await.expect("post");
            let status = answer.status().as_u16();
            (status, answer.text().await.unwrap_or_default())
        }
    });
    futures_util::future::join_all(sends).await
}

fn header(name: &str, value: impl Into<String>) -> (String, String) {
    (name.to_owned(), value.into())
}

/// The delivered events of `platform` with `id`.
fn delivered(dir: &std::path::Path, platform: &str, id: &str) -> usize {
    lines(dir)
        .iter()
        .filter(|l| l["platform"] == platform && l["event_id"] == id)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presets_deliver_ten_copies_once_and_refuse_forgeries() {
    let dir = tempfile::tempdir().expect("dir");
    let serve = Serve::start_with(dir.path(), &config(dir.path()));
    let all_ok = |answers: &[(u16, String)], what: &str| {
        assert!(
            answers.iter().all(|(s, _)| *s == 200),
            "{what}: {answers:?}"
        );
    };

    // Slack: its URL check, then one event ten times.
    let ts = now().to_string();
    let slack = |ts: &str, body: &str, secret: &str| {
        vec![
            header("X-Slack-Request-Timestamp", ts),
            header("X-Slack-Signature", python(SLACK_SIGN, &[secret, ts, body])),
        ]
    };
    let check = r#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let answered = post(
        &serve,
        "slack",
        "",
        &slack(&ts, check, SLACK_SECRET),
        check,
        1,
    )
    .await;
    assert_eq!(
        answered,
        vec![(
            200,
            "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".to_owned()
        )]
    );
    let event = format!(
        r#"{{"token":"t","team_id":"T1","api_app_id":"A0SLACK","event":{{"type":"message","channel":"C1","user":"U1","text":"hi","ts":"{ts}.000100"}},"type":"event_callback","event_id":"Ev0001","event_time":{ts}}}"#
    );
    all_ok(
        &post(
            &serve,
            "slack",
            "",
            &slack(&ts, &event, SLACK_SECRET),
            &event,
            10,
        )
        .await,
        "slack",
    );
    // Slack's retry: a new timestamp and signature, the same event_id.
    let later = (now() + 1).to_string();
    all_ok(
        &post(
            &serve,
            "slack",
            "",
            &slack(&later, &event, SLACK_SECRET),
            &event,
            1,
        )
        .await,
        "retry",
    );
    // Forged (another secret) and stale (Slack's doc example's timestamp, years ago).
    let forged = post(
        &serve,
        "slack",
        "",
        &slack(&ts, &event.replace("Ev0001", "Ev0002"), "not-the-secret"),
        &event.replace("Ev0001", "Ev0002"),
        1,
    )
    .await;
    assert_eq!(forged[0].0, 401, "{forged:?}");
    let stale_body = event.replace("Ev0001", "Ev0003");
    let stale = post(
        &serve,
        "slack",
        "",
        &slack("1531420618", &stale_body, SLACK_SECRET),
        &stale_body,
        1,
    )
    .await;
    assert!(stale[0].0 >= 400, "{stale:?}");

    // GitHub: a ping answered, an issue event ten times.
    let body = r#"{"action":"opened","issue":{"number":1},"repository":{"id":1296269},"installation":{"id":7}}"#;
    let github = |event: &str, delivery: &str| {
        vec![
            header("X-GitHub-Event", event),
            header("X-GitHub-Delivery", delivery),
            header("X-GitHub-Hook-ID", "42"),
            header(
                "X-Hub-Signature-256",
                format!("sha256={}", python(HMAC_HEX, &[GITHUB_SECRET, body])),
            ),
        ]
    };
    all_ok(
        &post(&serve, "github", "", &github("ping", "p-1"), body, 1).await,
        "ping",
    );
    all_ok(
        &post(
            &serve,
            "github",
            "",
            &github("issues", "72d3162e-cc78"),
            body,
            10,
        )
        .await,
        "github",
    );
    let mut tampered = github("issues", "72d3162e-cc79");
    tampered[3].1 = tampered[3].1.replace('a', "b");
    assert_eq!(
        post(&serve, "github", "", &tampered, body, 1).await[0].0,
        401
    );

    // Standard Webhooks, signed by its own library.
    let body = r#"{"type":"invoice.paid","id":1}"#;
    let signature = python(
        "import sys; from datetime import datetime, timezone; \
         from standardwebhooks.webhooks import Webhook; \
         print(Webhook(sys.argv[1]).sign(sys.argv[2], datetime.fromtimestamp(int(sys.argv[3]), tz=timezone.utc), sys.argv[4]))",
        &[STANDARD_SECRET, "msg_2Lt5", &ts, body],
    );
    let standard = vec![
        header("webhook-id", "msg_2Lt5"),
        header("webhook-timestamp", ts.clone()),
        header("webhook-signature", signature),
    ];
    all_ok(
        &post(&serve, "svix", "", &standard, body, 10).await,
        "standard webhooks",
    );

    // Telegram: its secret token; a wrong one refused.
    let update = r#"{"update_id":10000,"message":{"message_id":1,"date":1441645532,"chat":{"id":-1001234,"type":"supergroup"},"text":"/start"}}"#;
    all_ok(
        &post(
            &serve,
            "telegram",
            "",
            &[header("X-Telegram-Bot-Api-Secret-Token", "tg-secret_token")],
            update,
            10,
        )
        .await,
        "telegram",
    );
    assert_eq!(
        post(
            &serve,
            "telegram",
            "",
            &[header("X-Telegram-Bot-Api-Secret-Token", "guess")],
            update,
            1
        )
        .await[0]
            .0,
        401
    );

    // Discord, signed by PyNaCl: its PING answered PONG, an interaction ten times.
    let discord = |ts: &str, body: &str| {
        let signature = python(
            "import sys; from nacl.signing import SigningKey; \
             print(SigningKey(bytes.fromhex(sys.argv[1])).sign((sys.argv[2] + sys.argv[3]).encode()).signature.hex())",
            &[DISCORD_SEED, ts, body],
        );
        vec![
            header("X-Signature-Ed25519", signature),
            header("X-Signature-Timestamp", ts),
        ]
    };
    let ping = r#"{"type":1,"id":"1","application_id":"app1"}"#;
    assert_eq!(
        post(&serve, "discord", "", &discord(&ts, ping), ping, 1).await,
        vec![(200, r#"{"type":1}"#.to_owned())]
    );
    let command = r#"{"type":2,"id":"1179185358553571410","application_id":"app1","guild_id":"G1","channel_id":"C9","data":{"name":"blep"}}"#;
    let answers = post(&serve, "discord", "", &discord(&ts, command), command, 10).await;
    assert!(
        answers
            .iter()
            .all(|a| a == &(200, r#"{"type":5}"#.to_owned())),
        "{answers:?}"
    );
    let mut forged = discord(&ts, command);
    forged[1].1 = (now() + 2).to_string();
    assert_eq!(
        post(&serve, "discord", "", &forged, command, 1).await[0].0,
        401
    );

    // DingTalk's robot over HTTP: `timestamp` (ms) and `sign`, as DingTalk's snippet signs.
    let robot = r#"{"msgId":"msgRobot1","conversationId":"cidR","senderStaffId":"staff1","chatbotCorpId":"ding_corp","robotCode":"dingrobotkey","createAt":1700000000000,"msgtype":"text","text":{"content":"hi"}}"#;
    let ding = |ts: &str| {
        vec![
            header("timestamp", ts),
            header("sign", python(DINGTALK_SIGN, &[ts, DINGTALK_ROBOT_SECRET])),
        ]
    };
    let ts_ms = (now() * 1000).to_string();
    all_ok(
        &post(&serve, "dingrobot", "", &ding(&ts_ms), robot, 10).await,
        "dingtalk robot",
    );
    let mut forged = ding(&ts_ms);
    forged[1].1 = python(DINGTALK_SIGN, &[&ts_ms, "another-secret"]);
    assert_eq!(
        post(&serve, "dingrobot", "", &forged, robot, 1).await[0].0,
        401
    );
    let stale = ((now() - 2 * 3600) * 1000).to_string();
    let refused = post(&serve, "dingrobot", "", &ding(&stale), robot, 1).await;
    assert!(refused[0].0 >= 400, "two hours old: {refused:?}");

    // The seeds' gateways: seed 004's wkteam callback (unsigned), seed 002's xingyapi callback
    // (the URL's secret).
    let wk = r#"{"account":"1","messageType":"80001","wcId":"wxid_bot","data":{"wId":"0000016e-63eb","fromUser":"wxid_a","fromGroup":"123@chatroom","toUser":"wxid_bot","content":"hi","msgId":1,"newMsgId":7343011937658390000,"timestamp":1700000000,"self":false}}"#;
    all_ok(&post(&serve, "wkteam", "", &[], wk, 10).await, "wkteam");
    let xy = r#"{"MsgType":"text","roomType":2,"ChatId":"wr_abc","FromUserName":"wm_def","Content":"hello","MsgId":"19283746"}"#;
    all_ok(
        &post(&serve, "xingyapi", "?key=url-secret-123", &[], xy, 10).await,
        "xingyapi",
    );
    assert_eq!(
        post(&serve, "xingyapi", "?key=guess", &[], xy, 1).await[0].0,
        401
    );
    assert_eq!(post(&serve, "xingyapi", "", &[], xy, 1).await[0].0, 401);

    let expected = [
        ("slack", "Ev0001"),
        ("github", "42:72d3162e-cc78"),
        ("standard-webhooks", "msg_2Lt5"),
        ("telegram", "10000"),
        ("discord", "1179185358553571410"),
        ("dingtalk", "msgRobot1"),
        ("wkteam", "0000016e-63eb:7343011937658390000"),
        ("xingyapi", "19283746"),
    ];
    support::wait_until("every event delivered", Duration::from_secs(20), || {
        expected
            .iter()
            .all(|(p, id)| delivered(dir.path(), p, id) >= 1)
    })
    .await;
    // A moment for a second delivery to show, were there one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (platform, id) in expected {
        assert_eq!(
            delivered(dir.path(), platform, id),
            1,
            "{platform} {id}: {:?}",
            lines(dir.path())
        );
    }
    assert_eq!(
        lines(dir.path()).len(),
        expected.len(),
        "nothing else: {:?}",
        lines(dir.path())
    );
    let first = lines(dir.path());
    let slack_event = first
        .iter()
        .find(|l| l["platform"] == "slack")
        .expect("slack");
    assert_eq!(slack_event["order_key"], "C1", "{slack_event}");
    assert_eq!(slack_event["event_type"], "message", "{slack_event}");

    // check-config says what the unsigned source risks.
    let said = oncegate()
        .args(["check-config"])
        .arg(dir.path().join("oncegate.toml"))
        .output()
        .expect("check-config");
    let out = String::from_utf8_lossy(&said.stdout);
    assert!(
        out.contains("source[wkteam].verify") && out.contains("accepts unauthenticated events"),
        "{out}"
    );
    assert!(
        out.contains("source[dingrobot].preset") && out.contains("not the body"),
        "{out}"
    );
}

/// A source whose settings do not fit is refused by check-config and by serve, with the
/// setting named: an unknown preset, nothing checking the requests, a location that is none.
#[test]
fn settings_that_do_not_fit_are_refused_with_the_setting_named() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("bad.toml");
    for (source, said) in [
        (
            "preset = \"slak\"\nsecret = \"x\"",
            "preset: \"slak\" is not a preset",
        ),
        (
            "preset = \"wkteam\"",
            "nothing checks this source's requests",
        ),
        (
            "verify = \"hmac-sha256\"\nsignature = \"X-Sig\"\nsecret = \"x\"\nid = [\"/id\"]",
            "signature: \"X-Sig\" is not a place in a request",
        ),
        (
            "verify = \"none\"\nsecret = \"x\"\nid = [\"/id\"]",
            "verify = \"none\" checks nothing",
        ),
    ] {
        std::fs::write(
            &file,
            format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n[[source]]\nname = \"w\"\nplatform = \"webhook\"\n{source}\n"),
        )
        .expect("write");
        let output = oncegate()
            .args(["check-config"])
            .arg(&file)
            .output()
            .expect("check-config");
        let out = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(1), "{source}: {out}");
        assert!(out.contains(said), "{said:?} for {source}:\n{out}");
        let refused = support::refused_start(&file, &[]);
        assert!(
            refused.contains(said),
            "serve, {said:?} for {source}:\n{refused}"
        );
    }
}

/// The README's generic sources and its DingTalk sources, as written there, pass check-config
/// (sources built as serve builds them) with their secrets in the environment.
#[test]
fn the_readmes_generic_and_dingtalk_sources_are_valid() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    for heading in [
        "### Any platform: generic webhook sources",
        "### DingTalk (钉钉)",
        "#### DingTalk's Stream mode (the long connection)",
    ] {
        let section = readme.split(heading).nth(1).expect("the section");
        let block = section
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("its TOML");
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("readme.toml");
        std::fs::write(
            &file,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n{block}\n{}",
                file_route(dir.path(), "")
            ),
        )
        .expect("write");
        let output = oncegate()
            .args(["check-config"])
            .arg(&file)
            .env("SLACK_SIGNING_SECRET", "s1")
            .env("SLACK_SIGNING_SECRET_OLD", "s0")
            .env("ORDERS_SECRET", "o1")
            .env("DINGTALK_TOKEN", "t1")
            .env("DINGTALK_APP_SECRET", "cs1")
            .env(
                "DINGTALK_AES_KEY",
                "Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7",
            )
            .output()
            .expect("check-config");
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && !out.contains("error"),
            "{heading}: {out}"
        );
    }
}
