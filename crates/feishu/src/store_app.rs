//! A Feishu/Lark store app's (商店应用) lifecycle, read from its v1 events: the hourly
//! `app_ticket` (with the app secret it fetches the `app_access_token`), and the tenants that
//! install (`app_open`), enable or stop (`app_status_change`) and remove it
//! (`app_uninstalled`). Facts: `shared/protocols/tenants.md` §2.

use std::time::Duration;

use oncegate_core::{Event, TenancyChange};
use serde_json::Value;

/// How long an `app_ticket` is kept: Feishu pushes one every hour and does not document its
/// life; the official SDKs keep it 12 hours.
pub const APP_TICKET_LIFE: Duration = Duration::from_secs(12 * 3600);

/// The lifecycle event types a store app receives (v1 `event.type`).
pub const LIFECYCLE_EVENTS: [&str; 4] = [
    "app_ticket",
    "app_open",
    "app_status_change",
    "app_uninstalled",
];

/// What `event` (of the store app `app_id`) changes in its tenancy; `None` for other events,
/// and for a lifecycle event that lacks the field it turns on.
pub fn tenancy(app_id: &str, event: &Event) -> Option<TenancyChange> {
    if *event.app != *app_id || !LIFECYCLE_EVENTS.contains(&&*event.event_type) {
        return None;
    }
    let doc: Value = serde_json::from_slice(&event.payload).ok()?;
    let body = &doc["event"];
    if body["app_id"].as_str().is_some_and(|app| app != app_id) {
        return None;
    }
    let tenant = || {
        body["tenant_key"]
            .as_str()
            .filter(|key| !key.is_empty())
            .map(str::to_owned)
    };
    match &*event.event_type {
        "app_ticket" => Some(TenancyChange::Ticket {
            ticket: body["app_ticket"]
                .as_str()
                .filter(|ticket| !ticket.is_empty())?
                .to_owned(),
            issued_secs: event.created_at_ms / 1000,
            life: APP_TICKET_LIFE,
        }),
        "app_open" => Some(TenancyChange::Joined { tenant: tenant()? }),
        "app_status_change" => match body["status"].as_str()? {
            "start_by_tenant" => Some(TenancyChange::Joined { tenant: tenant()? }),
            "stop_by_tenant" | "stop_by_platform" => {
                Some(TenancyChange::Left { tenant: tenant()? })
            }
            _ => None,
        },
        "app_uninstalled" => Some(TenancyChange::Left { tenant: tenant()? }),
        _ => None,
    }
}

/// An `app_ticket` event of the store app `app_id` with its ticket replaced by `redacted`, for
/// routes: the gateway alone uses the ticket. `None` for every other event.
pub fn redacted(app_id: &str, event: &Event) -> Option<bytes::Bytes> {
    if *event.app != *app_id || &*event.event_type != "app_ticket" {
        return None;
    }
    let mut doc: Value = serde_json::from_slice(&event.payload).ok()?;
    let ticket = doc.get_mut("event")?.get_mut("app_ticket")?;
    *ticket = Value::String("redacted".into());
    serde_json::to_vec(&doc).ok().map(bytes::Bytes::from)
}
