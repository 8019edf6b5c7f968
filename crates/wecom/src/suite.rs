//! A WeCom third-party application (第三方应用) or 代开发 template: one source for every corp that
//! authorised it. Its command URL receives the suite's own pushes (`InfoType`: `suite_ticket`,
//! `create_auth`, `change_auth`, `cancel_auth`, `reset_permanent_code`), encrypted for the
//! SuiteId (or the ISV's own corp id, as seen in `create_auth`) and answered `success`; its data
//! URL receives every authorising corp's callbacks, encrypted for that corp and answered with an
//! empty 200. Both decrypt with the suite's one Token and EncodingAESKey, so the receive id inside
//! the ciphertext tells them apart: this source serves both URLs (one path, or two — the same
//! source). A corp's callback is taken only from a corp the suite knows ([`SuiteTenants`]).
//! Facts: `shared/protocols/tenants.md` §1.

use std::sync::Arc;

use bytes::Bytes;
use oncegate_core::{
    Accepted, Callback, Decoded, Event, Method, Refusal, RefusalKind, Reply, Stamp, TenancyChange,
    TenantSet, WebhookSource,
};

use crate::keys::{Origin, SUITE, XML};
use crate::query::Query;
use crate::signed::Signed;
use crate::source::{Dialect, REPLY_DEADLINE, Sealing, admit, envelope_encrypt, passive_reply};
use crate::xml::Fields;
use crate::{AesKey, WecomError, crypto};

/// How long a `suite_ticket` is valid: 30 minutes (pushed every 10).
const SUITE_TICKET_LIFE: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The event types of a suite's own pushes start with this.
pub const SUITE_EVENTS: &str = "suite.";

/// The corps that authorised a suite: read by its source on every callback, replaced whole by
/// whoever keeps the registry. Corp ids are opaque and case-sensitive (an encrypted corp id
/// is): never normalised.
pub type SuiteTenants = oncegate_core::Tenants;

/// A WeCom suite receiving callbacks for itself and for every corp that authorised it.
pub struct WecomSuite {
    suite_id: String,
    provider_corp_id: Option<String>,
    token: String,
    key: AesKey,
    tenants: Arc<SuiteTenants>,
}

impl std::fmt::Debug for WecomSuite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WecomSuite")
            .field("suite_id", &self.suite_id)
            .field("provider_corp_id", &self.provider_corp_id)
            .field("tenants", &self.tenants.len())
            .finish_non_exhaustive()
    }
}

impl WecomSuite {
    /// The suite `suite_id` (a 代开发 template's starts with `dk`) with the Token and
    /// EncodingAESKey of its callback configuration; `provider_corp_id` is the ISV's own corp
    /// id, which WeCom encrypts the URL verification for (and, as seen, some `create_auth`s).
    pub fn new(
        suite_id: &str,
        provider_corp_id: Option<&str>,
        token: &str,
        encoding_aes_key: &str,
    ) -> Result<Self, WecomError> {
        if suite_id.trim().is_empty() {
            return Err(WecomError::EmptySecret("suite id"));
        }
        if token.trim().is_empty() {
            return Err(WecomError::EmptySecret("token"));
        }
        Ok(Self {
            suite_id: suite_id.to_owned(),
            provider_corp_id: provider_corp_id
                .filter(|id| !id.trim().is_empty())
                .map(str::to_owned),
            token: token.to_owned(),
            key: AesKey::from_encoding_aes_key(encoding_aes_key)?,
            tenants: Arc::default(),
        })
    }

    /// The suite's id.
    pub fn suite_id(&self) -> &str {
        &self.suite_id
    }

    /// The corps whose callbacks are taken: shared with whoever keeps them current.
    pub fn tenants(&self) -> Arc<SuiteTenants> {
        self.tenants.clone()
    }

    /// Whether `receiver` is the suite itself (its pushes) rather than one of its corps.
    fn is_own(&self, receiver: &str) -> bool {
        receiver == self.suite_id || self.provider_corp_id.as_deref() == Some(receiver)
    }

    fn open(&self, callback: &Callback<'_>) -> Result<Decoded, SuiteError> {
        let query = Query::parse(callback.query);
        let signed = Signed::from(&query, "msg_signature")?;
        match callback.method {
            Method::Get => {
                let echostr = query.get("echostr").ok_or(WecomError::BadSignature)?;
                signed.verify(&self.token, Some(echostr))?;
                let (plain, receiver) = crypto::decrypt_any(&self.key, echostr)?;
                // Verified with the ISV's corp id as WeCom's answer says; the SuiteId too.
                if !self.is_own(&receiver) {
                    return Err(WecomError::WrongReceiver {
                        expected: self.suite_id.clone(),
                        got: receiver,
                    }
                    .into());
                }
                Ok(signed.challenge(Reply::text(plain))?)
            }
            Method::Post => {
                let (encrypt, dialect) = envelope_encrypt(callback.body)?;
                signed.verify(&self.token, Some(&encrypt))?;
                let stamp = signed.stamp(callback.body)?;
                if dialect != Dialect::Xml {
                    return Err(WecomError::BadDocument(
                        "a suite's callbacks are XML envelopes".into(),
                    )
                    .into());
                }
                let (document, receiver) = crypto::decrypt_any(&self.key, &encrypt)?;
                if self.is_own(&receiver) {
                    self.push(document, stamp)
                } else if callback.tenant.is_some_and(|named| named != receiver) {
                    // The data URL's `$CORPID$`: the corp it names is the one it encrypted for.
                    Err(WecomError::WrongReceiver {
                        expected: callback.tenant.unwrap_or_default().to_owned(),
                        got: receiver,
                    }
                    .into())
                } else if self.tenants.contains(&receiver) {
                    let origin = Origin {
                        platform: "wecom",
                        app: &receiver,
                        names: &XML,
                    };
                    Ok(admit(
                        &origin,
                        None,
                        Some(&receiver),
                        dialect,
                        document,
                        stamp,
                    )?)
                } else {
                    Err(SuiteError::UnknownCorp(receiver))
                }
            }
        }
    }

    /// One of the suite's own pushes: an `InfoType` for this suite.
    fn push(&self, document: Vec<u8>, stamp: Stamp) -> Result<Decoded, SuiteError> {
        let fields = Fields::parse(&document)?;
        if fields.text("InfoType").is_none() {
            return Err(
                WecomError::BadDocument("a push to the suite without an InfoType".into()).into(),
            );
        }
        if let Some(suite) = fields.text("SuiteId")
            && suite != self.suite_id
        {
            return Err(WecomError::WrongApp {
                expected: self.suite_id.clone(),
                got: suite.to_owned(),
            }
            .into());
        }
        let origin = Origin {
            platform: "wecom",
            app: &self.suite_id,
            names: &SUITE,
        };
        Ok(admit(&origin, None, None, Dialect::Xml, document, stamp)?)
    }
}

/// Why a suite's callback was refused.
#[derive(Debug)]
enum SuiteError {
    Wecom(WecomError),
    /// Encrypted for a corp the suite does not know (yet): not authorised, or its
    /// authorisation is being set up.
    UnknownCorp(String),
}

impl From<WecomError> for SuiteError {
    fn from(error: WecomError) -> Self {
        Self::Wecom(error)
    }
}

impl SuiteError {
    fn refusal(self) -> Refusal {
        match self {
            SuiteError::Wecom(error) => error.refusal(),
            // Signed with the suite's key, so authentic: a corp whose authorisation is still
            // being recorded is known within a moment, and WeCom retries (three times).
            SuiteError::UnknownCorp(corp) => Refusal::new(
                RefusalKind::Unavailable,
                "unknown_tenant",
                format!(
                    "a callback for corp {corp:?}, which has not authorised this suite (or whose \
                     authorisation is being recorded): add it (oncegate tenants add) if it should \
                     be served"
                ),
            ),
        }
    }
}

impl WebhookSource for WecomSuite {
    fn platform(&self) -> &str {
        "wecom"
    }

    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal> {
        self.open(callback).map_err(SuiteError::refusal)
    }

    /// A corp's callback takes the empty 200.
    fn accepted(&self, _how: Accepted) -> Reply {
        Reply::text(Bytes::new())
    }

    /// The suite's own pushes must be answered `success` (anything else is shown to the admin
    /// as an error); a corp's callbacks the empty 200.
    fn accepted_as(&self, how: Accepted, event_type: &str) -> Reply {
        if event_type.starts_with(SUITE_EVENTS) {
            Reply::text(Bytes::from_static(b"success"))
        } else {
            self.accepted(how)
        }
    }

    /// Retries reuse the query, as a corp's own callbacks do.
    fn retries_repeat_the_request(&self) -> bool {
        true
    }

    /// A corp's passive reply, encrypted for that corp with the suite's token and key; no
    /// answer is the empty 200. The suite's own pushes take `success` whatever a replying route
    /// answered (anything else is shown to the ISV's admin as an error).
    fn sync_reply_for(&self, result: Option<Bytes>, request: Option<&Stamp>, app: &str) -> Reply {
        if app == self.suite_id {
            return Reply::text(Bytes::from_static(b"success"));
        }
        match result.filter(|answer| !answer.is_empty()) {
            Some(answer) => passive_reply(
                Sealing {
                    token: &self.token,
                    key: &self.key,
                    receive_id: app,
                },
                &answer,
                request,
            ),
            _ => Reply::text(Bytes::new()),
        }
    }

    /// WeCom waits 5 s for a corp's reply.
    fn sync_deadline(&self) -> std::time::Duration {
        REPLY_DEADLINE
    }

    fn tenants(&self) -> Option<Arc<dyn TenantSet>> {
        Some(self.tenants.clone())
    }

    /// A `suite_ticket` is the suite's newest ticket; a `cancel_auth` takes its corp out of the
    /// registry; a `create_auth` or `reset_permanent_code` carries a code to exchange for the
    /// corp's permanent code. Other pushes change nothing here (their routes act on them).
    /// A ticket or an authorisation code goes to routes as `redacted`: the gateway alone uses
    /// them.
    fn redacted(&self, event: &Event) -> Option<Bytes> {
        if *event.app != *self.suite_id || !event.event_type.starts_with(SUITE_EVENTS) {
            return None;
        }
        let fields = Fields::parse(&event.payload).ok()?;
        let secret = ["SuiteTicket", "AuthCode"]
            .iter()
            .find_map(|name| fields.text(name))?;
        Some(Bytes::from(redact(&event.payload, secret, &fields)))
    }

    fn tenancy(&self, event: &Event) -> Option<TenancyChange> {
        if *event.app != *self.suite_id || !event.event_type.starts_with(SUITE_EVENTS) {
            return None;
        }
        let fields = Fields::parse(&event.payload).ok()?;
        match fields.text("InfoType")? {
            "suite_ticket" => Some(TenancyChange::Ticket {
                ticket: fields.text("SuiteTicket")?.to_owned(),
                issued_secs: fields.text("TimeStamp")?.parse().ok()?,
                life: SUITE_TICKET_LIFE,
            }),
            "cancel_auth" => Some(TenancyChange::Left {
                tenant: fields.text("AuthCorpId")?.to_owned(),
            }),
            "change_auth" => Some(TenancyChange::Rescoped {
                tenant: fields.text("AuthCorpId")?.to_owned(),
            }),
            "create_auth" | "reset_permanent_code" => Some(TenancyChange::Authorised {
                auth_code: fields.text("AuthCode")?.to_owned(),
            }),
            _ => None,
        }
    }
}

/// `document` with every occurrence of `secret` replaced by `redacted`; a secret that does not
/// stand in the bytes as it reads (escaped in the XML) leaves only what routes need: the
/// suite, the push's type and time, and the corp it concerns.
fn redact(document: &[u8], secret: &str, fields: &Fields) -> Vec<u8> {
    let secret = secret.as_bytes();
    if secret.is_empty() {
        return document.to_vec();
    }
    let mut out = Vec::with_capacity(document.len());
    let mut rest = document;
    let mut found = false;
    while let Some(at) = rest
        .windows(secret.len())
        .position(|window| window == secret)
    {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(b"redacted");
        rest = &rest[at + secret.len()..];
        found = true;
    }
    out.extend_from_slice(rest);
    if found {
        return out;
    }
    let mut minimal = String::from("<xml>");
    for name in ["SuiteId", "InfoType", "TimeStamp", "AuthCorpId"] {
        if let Some(text) = fields.text(name) {
            let text = text.replace(']', "");
            minimal.push_str(&format!("<{name}><![CDATA[{text}]]></{name}>"));
        }
    }
    minimal.push_str("</xml>");
    minimal.into_bytes()
}
