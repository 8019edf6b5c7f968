//! Self-built apps of many corps behind one source (a template): a vendor that has each
//! customer corp create its own app (自建应用) gets one Token, EncodingAESKey and AgentID per
//! corp, and wants one gateway source for all of them. The corps and their secrets live in the
//! tenant registry, not in the file; each callback is checked with its own corp's secrets only —
//! the corp named by the URL (`/webhook/<source>/<corp id>`), or else by the envelope's
//! `ToUserName` (one URL for all) — and is that corp's event, as from a [`WecomApp`] of its own.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use oncegate_core::{
    Accepted, Callback, Decoded, Event, Method, Refusal, RefusalKind, Reply, Stamp, TenantSet,
    Versions, WebhookSource,
};
use serde::Deserialize as _;

use crate::WecomApp;
use crate::source::REPLY_DEADLINE;
use crate::xml::Fields;

/// The most corps a URL verification at the one URL for all is tried against: WeCom's GET
/// names no corp, so each corp's signature is tried in turn; past this, a corp verifies at the
/// URL that names it.
pub const MAX_UNNAMED_VERIFICATION: usize = 1024;

/// What a corp's settings in the registry hold: its callback secrets and, optionally, its app.
#[derive(serde::Deserialize)]
struct CorpSettings {
    token: Option<String>,
    encoding_aes_key: Option<String>,
    #[serde(default, deserialize_with = "agent")]
    agent_id: Option<String>,
}

/// An AgentID as written: a number or a string of digits.
fn agent<'de, D: serde::Deserializer<'de>>(reader: D) -> Result<Option<String>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(reader)?;
    Ok(match value {
        Some(serde_json::Value::Number(number)) => Some(number.to_string()),
        Some(serde_json::Value::String(text)) => Some(text),
        _ => None,
    })
}

/// The app a corp's settings make, or why they cannot make one.
fn app_of(corp: &str, settings: &[u8]) -> Result<WecomApp, String> {
    // serde's message may quote the value it could not read (a secret): only its place.
    let settings: CorpSettings = serde_json::from_slice(settings).map_err(|error| {
        format!(
            "the settings are not a template corp's (line {}, column {}): a JSON object whose \
             token and encoding_aes_key are strings and agent_id a number or a string",
            error.line(),
            error.column()
        )
    })?;
    let (Some(token), Some(key)) = (settings.token, settings.encoding_aes_key) else {
        return Err(
            "a template's corp needs its own \"token\" and \"encoding_aes_key\" (its app's \
             callback settings) in its settings"
                .into(),
        );
    };
    let app = WecomApp::new(corp, &token, &key).map_err(|error| error.to_string())?;
    Ok(match settings.agent_id {
        Some(agent) if !agent.trim().is_empty() => app.for_agent(agent.trim()),
        _ => app,
    })
}

/// The corps a template serves, each with its app: read on every callback, replaced whole by
/// whoever keeps the registry (built before the lock is taken).
#[derive(Debug, Default)]
pub struct CorpApps {
    apps: RwLock<HashMap<String, Arc<WecomApp>>>,
}

impl CorpApps {
    fn app(&self, corp: &str) -> Option<Arc<WecomApp>> {
        self.apps
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(corp)
            .cloned()
    }

    fn all(&self) -> Vec<Arc<WecomApp>> {
        self.apps
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn install(&self, apps: HashMap<String, Arc<WecomApp>>) {
        let old = std::mem::replace(
            &mut *self
                .apps
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            apps,
        );
        drop(old);
    }
}

impl TenantSet for CorpApps {
    /// Ids alone make no app: every corp needs its secrets, so ids alone serve none.
    fn replace(&self, tenants: Vec<String>) {
        let _ = tenants;
        self.install(HashMap::new());
    }

    fn replace_with_settings(&self, tenants: Vec<(String, Bytes)>) -> Vec<(String, String)> {
        let mut apps = HashMap::with_capacity(tenants.len());
        let mut left_out = Vec::new();
        for (corp, settings) in tenants {
            match app_of(&corp, &settings) {
                Ok(app) => {
                    apps.insert(corp, Arc::new(app));
                }
                Err(why) => left_out.push((corp, why)),
            }
        }
        self.install(apps);
        left_out
    }

    fn check_settings(&self, settings: &[u8]) -> Result<(), String> {
        app_of("check", settings).map(drop)
    }

    fn contains(&self, tenant: &str) -> bool {
        self.app(tenant).is_some()
    }

    fn len(&self) -> usize {
        self.apps
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }
}

/// Self-built apps of many corps, each corp's secrets from the registry.
#[derive(Debug, Default)]
pub struct WecomCorps {
    corps: Arc<CorpApps>,
}

impl WecomCorps {
    /// A template with no corps yet: the registry brings them.
    pub fn new() -> Self {
        Self::default()
    }

    /// The corps it serves: shared with whoever keeps them current.
    pub fn corps(&self) -> Arc<CorpApps> {
        self.corps.clone()
    }

    /// The app that checks `callback`: its URL's corp, else its envelope's `ToUserName`; a
    /// URL verification at the one URL for all is tried against every corp's signature.
    fn app_for(&self, callback: &Callback<'_>) -> Result<Option<Arc<WecomApp>>, Refusal> {
        let corp = match (callback.tenant, callback.method) {
            (Some(corp), _) => corp.to_owned(),
            (None, Method::Post) => Fields::parse(callback.body)
                .ok()
                .and_then(|fields| fields.text("ToUserName").map(str::to_owned))
                .ok_or_else(|| crate::WecomError::BadSignature.refusal())?,
            (None, Method::Get) => return Ok(None),
        };
        self.corps.app(&corp).map(Some).ok_or_else(unknown)
    }
}

/// A callback for a corp not in the registry: with its secrets unknown nothing about it is
/// authentic, so it is answered as any unsigned callback — a prober learns no corp the template
/// serves — and counted apart (`unknown_tenant`) for the operator. WeCom retries, and a corp
/// being added is served within a moment.
fn unknown() -> Refusal {
    let unsigned = crate::WecomError::BadSignature.refusal();
    Refusal::new(unsigned.kind, "unknown_tenant", unsigned.message)
}

impl WebhookSource for WecomCorps {
    fn platform(&self) -> &str {
        "wecom"
    }

    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal> {
        if let Some(app) = self.app_for(callback)? {
            return app.decode(callback);
        }
        // A URL verification at the one URL for all: the corp whose signature it carries.
        if self.corps.len() > MAX_UNNAMED_VERIFICATION {
            return Err(Refusal::new(
                RefusalKind::BadInput,
                "name_the_tenant",
                format!(
                    "this template serves more than {MAX_UNNAMED_VERIFICATION} corps: verify \
                     each corp's URL as /webhook/<source>/<corp id>"
                ),
            ));
        }
        let apps = self.corps.all();
        if apps.is_empty() {
            return Err(unknown());
        }
        let mut refused = None;
        for app in apps {
            match app.decode(callback) {
                Ok(decoded) => return Ok(decoded),
                Err(refusal) if refusal.kind == RefusalKind::Unauthenticated => {
                    refused.get_or_insert(refusal);
                }
                Err(refusal) => return Err(refusal),
            }
        }
        Err(refused.unwrap_or_else(|| crate::WecomError::BadSignature.refusal()))
    }

    /// WeCom takes an empty 200 as "received".
    fn accepted(&self, _how: Accepted) -> Reply {
        Reply::text(Bytes::new())
    }

    fn retries_repeat_the_request(&self) -> bool {
        true
    }

    fn versions(&self, event: &Event) -> Option<Versions> {
        self.corps.app(&event.app)?.versions(event)
    }

    fn tenants(&self) -> Option<Arc<dyn TenantSet>> {
        Some(self.corps.clone())
    }

    /// No corp named: nothing to seal a reply for.
    fn sync_reply(&self, _result: Option<Bytes>, _request: Option<&Stamp>) -> Reply {
        Reply::text(Bytes::new())
    }

    /// The reply sealed for the event's own corp, with its secrets.
    fn sync_reply_for(&self, result: Option<Bytes>, request: Option<&Stamp>, app: &str) -> Reply {
        match self.corps.app(app) {
            Some(corp) => corp.sync_reply(result, request),
            None => Reply::text(Bytes::new()),
        }
    }

    fn sync_deadline(&self) -> std::time::Duration {
        REPLY_DEADLINE
    }
}
