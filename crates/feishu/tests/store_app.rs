//! A store app's lifecycle events, as Feishu's documentation shows them (the v1 samples of the
//! `app_ticket`, 首次启用应用 `app_open`, `app_status_change` and `app_uninstalled` pages),
//! decoded through the app's own decoder: what each changes in the app's tenancy.

use std::time::Duration;

use oncegate_core::{Event, TenancyChange, WebhookSource};
use oncegate_feishu::{Cloud, FeishuApp, Inbound};

const APP: &str = "cli_9e28cb7ba56a100e";
const TOKEN: &str = "41a9425ea7df4536a7623e38fa321bae";

/// The `app_ticket` page's example.
const TICKET: &str = r#"{"ts":"1502199207.7171419","uuid":"bc447199585340d1f3728d26b1c0297a","token":"41a9425ea7df4536a7623e38fa321bae","type":"event_callback","event":{"app_id":"cli_9e28cb7ba56a100e","app_ticket":"xxxxx","type":"app_ticket"}}"#;

/// The 首次启用应用 (`app_open`) page's example.
const OPEN: &str = r#"{"ts":"1502199207.7171419","uuid":"bc447199585340d1f3728d26b1c0297b","token":"41a9425ea7df4536a7623e38fa321bae","type":"event_callback","event":{"app_id":"cli_9e28cb7ba56a100e","tenant_key":"2ca1d211f64f6438","type":"app_open","applicants":[{"open_id":"ou_d317f090b7258ad0372aa53963cda70d"}],"installer":{"open_id":"ou_2c2a7a8a6f3f1f3a3b6b3f3a3b6b3f3a"},"installer_employee":{"open_id":"ou_2c2a7a8a6f3f1f3a3b6b3f3a3b6b3f3a"}}}"#;

/// `app_status_change` with `status`, as the Go SDK's `P1AppStatusChangedV6Data` reads it.
fn status_change(status: &str, uuid: &str) -> String {
    format!(
        r#"{{"ts":"1502199207.7171419","uuid":"{uuid}","token":"{TOKEN}","type":"event_callback","event":{{"app_id":"{APP}","tenant_key":"2ca1d211f64f6438","type":"app_status_change","status":"{status}","operator":{{"open_id":"ou_x","user_id":"u_x","union_id":"on_x"}}}}}}"#
    )
}

/// The `app_uninstalled` page's example.
const UNINSTALLED: &str = r#"{"ts":"1502199207.7171419","uuid":"bc447199585340d1f3728d26b1c0297e","token":"41a9425ea7df4536a7623e38fa321bae","type":"event_callback","event":{"app_id":"cli_9e28cb7ba56a100e","tenant_key":"2ca1d211f64f6438","type":"app_uninstalled"}}"#;

fn app() -> FeishuApp {
    FeishuApp::new(Cloud::Feishu, APP, None, Some(TOKEN.into())).expect("app")
}

fn decoded(app: &FeishuApp, document: &str) -> Event {
    match app.open_pushed(document.as_bytes()).expect("decoded") {
        Inbound::Event(verified) => verified.event,
        other => panic!("not an event: {other:?}"),
    }
}

#[test]
fn a_store_apps_lifecycle_events_change_its_ticket_and_tenants() {
    let store = app().store_app();
    assert!(store.tenants().is_some());
    let ticket = decoded(&store, TICKET);
    assert_eq!(&*ticket.event_type, "app_ticket");
    assert_eq!(
        store.tenancy(&ticket),
        Some(TenancyChange::Ticket {
            ticket: "xxxxx".into(),
            issued_secs: 1_502_199_207,
            life: Duration::from_secs(12 * 3600),
        })
    );
    let joined = Some(TenancyChange::Joined {
        tenant: "2ca1d211f64f6438".into(),
    });
    let left = Some(TenancyChange::Left {
        tenant: "2ca1d211f64f6438".into(),
    });
    assert_eq!(store.tenancy(&decoded(&store, OPEN)), joined);
    let started = decoded(&store, &status_change("start_by_tenant", "u-start"));
    assert_eq!(store.tenancy(&started), joined);
    for stop in ["stop_by_tenant", "stop_by_platform"] {
        let stopped = decoded(&store, &status_change(stop, &format!("u-{stop}")));
        assert_eq!(store.tenancy(&stopped), left, "{stop}");
    }
    assert_eq!(store.tenancy(&decoded(&store, UNINSTALLED)), left);
    // A status Feishu may add later changes nothing.
    let unknown = decoded(&store, &status_change("paused_by_someone", "u-unknown"));
    assert_eq!(store.tenancy(&unknown), None);
}

#[test]
fn an_app_of_one_tenant_and_other_events_change_nothing() {
    let custom = app();
    assert!(custom.tenants().is_none());
    assert_eq!(custom.tenancy(&decoded(&custom, TICKET)), None);
    assert_eq!(custom.tenancy(&decoded(&custom, OPEN)), None);
    let store = custom.store_app();
    // A ticket without its field is no ticket.
    let empty = TICKET.replace(r#""app_ticket":"xxxxx","#, "");
    assert_eq!(store.tenancy(&decoded(&store, &empty)), None);
    // An ordinary event of a tenant is only routed.
    let message = r#"{"schema":"2.0","header":{"event_id":"e1","event_type":"im.message.receive_v1","create_time":"1608725989000","token":"41a9425ea7df4536a7623e38fa321bae","app_id":"cli_9e28cb7ba56a100e","tenant_key":"2ca1d211f64f6438"},"event":{"message":{"chat_id":"oc_1"}}}"#;
    let event = decoded(&store, message);
    assert_eq!(event.tenant.as_deref(), Some("2ca1d211f64f6438"));
    assert_eq!(store.tenancy(&event), None);
}

/// The documented `app_ticket` event goes to routes with its ticket `redacted` (the gateway
/// alone uses it), the rest as it came; an app of one tenant and other events are untouched.
#[test]
fn the_ticket_goes_to_routes_redacted() {
    let store = app().store_app();
    let ticket = decoded(&store, TICKET);
    let redacted = store.redacted(&ticket).expect("redacted");
    let doc: serde_json::Value = serde_json::from_slice(&redacted).expect("json");
    assert_eq!(doc["event"]["app_ticket"], "redacted");
    assert_eq!(doc["event"]["app_id"], APP);
    assert_eq!(doc["uuid"], "bc447199585340d1f3728d26b1c0297a");
    assert!(app().redacted(&decoded(&app(), TICKET)).is_none());
    assert!(store.redacted(&decoded(&store, OPEN)).is_none());
}
