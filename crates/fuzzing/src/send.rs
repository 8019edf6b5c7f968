//! The sending seam's reading of a caller's body, for every platform.

use oncegate_send::wecom::WecomOptions;
use oncegate_send::{Api, FeishuApi, WecomApi};

/// A `/send` body as JSON: each platform either prepares it (with at least one budget, the
/// payload a reused key must match, and for WeCom its agent and duplicate check) or says why
/// not; never a panic.
pub fn send_body(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let feishu = match FeishuApi::new(
        "http://127.0.0.1:9",
        "cli_fuzz",
        "s",
        std::time::Duration::from_secs(1),
    ) {
        Ok(api) => Api::Feishu(api),
        Err(error) => panic!("the fuzz Feishu app: {error}"),
    };
    let wecom = match WecomApi::new(
        "http://127.0.0.1:9",
        "ww_fuzz",
        7,
        "s",
        WecomOptions::default(),
    ) {
        Ok(api) => Api::Wecom(api),
        Err(error) => panic!("the fuzz WeCom app: {error}"),
    };
    for api in [&feishu, &wecom] {
        if let Ok(prepared) = api.prepare(body.clone(), "k".repeat(32)) {
            assert!(!prepared.budgets.is_empty(), "every send spends a budget");
            assert!(!prepared.payload.is_null());
            if let Api::Wecom(_) = api {
                assert_eq!(prepared.payload["agentid"], 7, "the agent is the app's");
            }
        }
    }
}
