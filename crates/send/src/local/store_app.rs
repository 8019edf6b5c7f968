//! The store-app (商店应用) part of the local Feishu API: `app_ticket/resend` issues a new ticket
//! and hands it to whoever plays Feishu's push (the ticket reaches the app as an event, never in
//! the answer); `app_access_token` takes only a ticket it issued (else 10012);
//! `tenant_access_token` takes only an app token it issued (else 99991664) and gives each tenant
//! its own token, so that a send shows whose token it carried.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};

use super::{LocalFeishuApi, Shared, answer};

/// Called with each ticket issued by a resend: it plays Feishu pushing the `app_ticket` event.
pub type TicketPush = Arc<dyn Fn(String) + Send + Sync>;

#[derive(Default)]
pub(super) struct StoreState {
    tickets: Vec<String>,
    issued: u64,
    resends: u64,
    app_tokens: HashMap<String, Instant>,
    app_token_requests: u64,
    tenant_token_requests: HashMap<String, u64>,
    tenant_of: HashMap<String, String>,
    push: Option<TicketPush>,
}

impl StoreState {
    /// The tenant whose token `token` is.
    pub(super) fn tenant_of(&self, token: &str) -> Option<String> {
        self.tenant_of.get(token).cloned()
    }

    fn issue(&mut self) -> String {
        self.issued += 1;
        let ticket = format!("ticket-local-{}", self.issued);
        self.tickets.push(ticket.clone());
        ticket
    }
}

pub(super) fn routes() -> axum::Router<Arc<Shared>> {
    axum::Router::new()
        .route("/open-apis/auth/v3/app_ticket/resend", post(resend))
        .route("/open-apis/auth/v3/app_access_token", post(app_token))
        .route("/open-apis/auth/v3/tenant_access_token", post(tenant_token))
}

fn credentials_ok(shared: &Shared, body: &Value) -> bool {
    body["app_id"] == shared.app_id.as_str() && body["app_secret"] == shared.app_secret.as_str()
}

async fn resend(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    if !credentials_ok(&shared, &body) {
        return answer(
            StatusCode::OK,
            json!({"code": 10014, "msg": "app secret invalid"}),
        );
    }
    let (ticket, push) = {
        let mut inner = shared.lock();
        inner.store.resends += 1;
        (inner.store.issue(), inner.store.push.clone())
    };
    if let Some(push) = push {
        push(ticket);
    }
    answer(StatusCode::OK, json!({"code": 0, "msg": "ok"}))
}

async fn app_token(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    if !credentials_ok(&shared, &body) {
        return answer(
            StatusCode::OK,
            json!({"code": 10014, "msg": "app secret invalid"}),
        );
    }
    let mut inner = shared.lock();
    inner.store.app_token_requests += 1;
    let ticket = body["app_ticket"].as_str().unwrap_or_default();
    if !inner.store.tickets.iter().any(|known| known == ticket) {
        return answer(
            StatusCode::OK,
            json!({"code": 10012, "msg": "app_ticket is invalid"}),
        );
    }
    let token = format!("a-local-{}", inner.store.app_token_requests);
    let lifetime = shared.lifetime;
    inner
        .store
        .app_tokens
        .insert(token.clone(), Instant::now() + lifetime);
    answer(
        StatusCode::OK,
        json!({"code": 0, "msg": "ok", "app_access_token": token, "expire": lifetime.as_secs()}),
    )
}

async fn tenant_token(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    let mut inner = shared.lock();
    let now = Instant::now();
    let app_token = body["app_access_token"].as_str().unwrap_or_default();
    if inner
        .store
        .app_tokens
        .get(app_token)
        .is_none_or(|until| *until <= now)
    {
        return answer(
            StatusCode::OK,
            json!({"code": 99991664, "msg": "invalid app access token"}),
        );
    }
    let Some(tenant) = body["tenant_key"].as_str().filter(|key| !key.is_empty()) else {
        return answer(
            StatusCode::OK,
            json!({"code": 99992402, "msg": "field validation failed: tenant_key"}),
        );
    };
    let count = {
        let count = inner
            .store
            .tenant_token_requests
            .entry(tenant.to_owned())
            .or_default();
        *count += 1;
        *count
    };
    let token = format!("t-{tenant}-{count}");
    inner.tokens.insert(token.clone(), now + shared.lifetime);
    inner
        .store
        .tenant_of
        .insert(token.clone(), tenant.to_owned());
    answer(
        StatusCode::OK,
        json!({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": shared.lifetime.as_secs()}),
    )
}

impl LocalFeishuApi {
    /// Issues a ticket, as Feishu does every hour, and returns it (the caller pushes it).
    pub fn issue_ticket(&self) -> String {
        self.shared.lock().store.issue()
    }

    /// Every ticket issued so far is refused from now on (10012).
    pub fn revoke_tickets(&self) {
        self.shared.lock().store.tickets.clear();
    }

    /// Makes every app token invalid (99991664 at `tenant_access_token`).
    pub fn expire_app_tokens(&self) {
        self.shared.lock().store.app_tokens.clear();
    }

    /// Hands each ticket a resend issues to `push` (which plays Feishu's event push).
    pub fn push_tickets_to(&self, push: TicketPush) {
        self.shared.lock().store.push = Some(push);
    }

    /// `app_ticket/resend` calls taken.
    pub fn resends(&self) -> u64 {
        self.shared.lock().store.resends
    }

    /// `app_access_token` calls answered (refused ones included).
    pub fn app_token_requests(&self) -> u64 {
        self.shared.lock().store.app_token_requests
    }

    /// `tenant_access_token` calls answered with a token for `tenant`.
    pub fn tenant_token_requests(&self, tenant: &str) -> u64 {
        self.shared
            .lock()
            .store
            .tenant_token_requests
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }
}
