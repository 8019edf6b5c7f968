//! A WeCom suite's traffic as WeCom sends it, for the suite tests: pushes to the command URL
//! encrypted for the SuiteId, corps' callbacks encrypted for each corp (the sealer is checked
//! against wechatpy's in crates/wecom/tests/suite.rs), and the README's suite source.

use oncegate_core::{SealedRequest, Sealer, SyntheticMessage};
use oncegate_wecom::WecomApp;

use super::Serve;

pub(crate) const SUITE_ID: &str = "ww4asffe99e54c0f4c";
pub(crate) const TOKEN: &str = "suite-e2e-token";
pub(crate) const KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// The README's section on suites.
pub(crate) fn readme_section() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    readme
        .split_once("### Many tenants: WeCom third-party suites")
        .expect("the README's section on suites")
        .1
        .to_owned()
}

/// The section's first block in `language`.
pub(crate) fn readme_block(language: &str) -> String {
    readme_section()
        .split_once(&format!("```{language}\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("a {language} block in the README's section on suites"))
        .0
        .to_owned()
}

/// The README's suite source with its token and key given inline.
pub(crate) fn readme_source() -> String {
    readme_block("toml")
        .replace(r#"{ env = "SUITE_TOKEN" }"#, &format!("\"{TOKEN}\""))
        .replace(r#"{ env = "SUITE_AES_KEY" }"#, &format!("\"{KEY}\""))
}

/// The README's suite source without its secret: corps added by hand, nothing calls WeCom.
pub(crate) fn readme_source_by_hand() -> String {
    readme_source()
        .lines()
        .filter(|line| !line.starts_with("suite_secret"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A push to the suite as WeCom sends it: `document` encrypted for the SuiteId.
pub(crate) fn suite_push(document: &str, nonce: &str) -> SealedRequest {
    let sealer = WecomApp::new(SUITE_ID, TOKEN, KEY).expect("sealer");
    sealer.seal(document.as_bytes(), now(), nonce, [5; 16])
}

/// A `suite_ticket` push's document.
pub(crate) fn ticket(value: &str, issued_secs: u64) -> String {
    format!(
        "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><InfoType><![CDATA[suite_ticket]]></InfoType><TimeStamp>{issued_secs}</TimeStamp><SuiteTicket><![CDATA[{value}]]></SuiteTicket></xml>"
    )
}

/// A corp's message as WeCom posts it to the suite's data URL: encrypted for the corp with the
/// suite's token and key, stamped now.
pub(crate) fn corp_message(corp: &str, id: &str) -> SealedRequest {
    corp_message_sealed(corp, (TOKEN, KEY, None), id)
}

/// A message of `corp`'s app (of `agent`, when given) encrypted for the corp with `token` and
/// `key`, stamped now, as WeCom posts it.
pub(crate) fn corp_message_sealed(
    corp: &str,
    (token, key, agent): (&str, &str, Option<&str>),
    id: &str,
) -> SealedRequest {
    let sealer = WecomApp::new(corp, token, key).expect("sealer");
    let sealer = match agent {
        Some(agent) => sealer.for_agent(agent),
        None => sealer,
    };
    let now = now();
    let plain = sealer.message(&SyntheticMessage {
        id: id.to_owned(),
        chat: format!("chat-{id}"),
        sender: "zhangsan".into(),
        text: "hello".into(),
        created_ms: now * 1000,
    });
    sealer.seal(&plain, now, &format!("n{id}"), [9; 16])
}

/// Posts `sealed` to the gateway's `/webhook/suite`: the status and body.
pub(crate) async fn post(gateway: &Serve, sealed: &SealedRequest) -> (u16, String) {
    super::post_sealed(gateway, "suite", sealed).await
}
