//! The seams between transports, platforms and the store: what a platform decodes a callback
//! into ([`Decoded`], carrying an [`Admit`]), why it refuses one ([`Refusal`]), and the trait a
//! platform implements to receive webhooks ([`WebhookSource`]). No I/O: the gateway speaks HTTP
//! and calls these.

use std::fmt;

use bytes::Bytes;

use crate::event::Event;
use crate::key::KeyHash;
use crate::record::Nonce;
pub use crate::tenancy::{Owner, TenancyChange, TenantSet, Tenants};

/// An event's dedup keys: never empty, the primary (event-id) key first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys(Vec<KeyHash>);

impl Keys {
    /// The keys of an event whose primary key is `primary`.
    pub fn new(primary: KeyHash) -> Self {
        // Room for the secondary key most events of a chat carry: one allocation, not two.
        let mut keys = Vec::with_capacity(2);
        keys.push(primary);
        Self(keys)
    }

    /// Adds a secondary key (a message id that a platform may resend under a new event id).
    pub fn with(mut self, key: KeyHash) -> Self {
        self.0.push(key);
        self
    }

    /// The primary key.
    pub fn primary(&self) -> KeyHash {
        self.0[0]
    }

    /// Only the primary key (dedup on secondary keys switched off).
    pub fn primary_only(&self) -> Self {
        Self::new(self.primary())
    }

    /// Every key, the primary first; never empty.
    pub fn as_slice(&self) -> &[KeyHash] {
        &self.0
    }

    /// Keys read back from elsewhere (a spool): `None` when there are none.
    pub fn from_vec(keys: Vec<KeyHash>) -> Option<Self> {
        (!keys.is_empty()).then_some(Self(keys))
    }
}

/// The one value that travels from any transport to the store: the event, its keys, and the
/// request's nonce when it has one (set by the gateway once the replay stamp passed).
#[derive(Debug, Clone, PartialEq)]
pub struct Admit {
    /// The normalized event.
    pub event: Event,
    /// Its dedup keys.
    pub keys: Keys,
    /// The request's nonce, checked and remembered with the admission.
    pub nonce: Option<Nonce>,
}

impl Admit {
    /// An admission without a nonce yet.
    pub fn new(event: Event, keys: Keys) -> Self {
        Self {
            event,
            keys,
            nonce: None,
        }
    }
}

/// A request's replay stamp as the platform sent it: checked by the gateway, in one place,
/// before admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The request's timestamp, unix seconds.
    pub timestamp_secs: u64,
    /// The request's nonce.
    pub nonce: String,
    /// A digest of the whole request, for platforms whose nonces are not unique per request
    /// (WeCom, WeChat): the replay memory then knows the request, not the nonce alone, so that
    /// another event that happens to carry a nonce seen before is admitted, not taken for a
    /// replay and answered 200 unadmitted. `None` where the nonce is the request's own.
    pub request: Option<String>,
}

impl Stamp {
    /// What the replay memory remembers of the request: its nonce, with the request's digest
    /// when the platform gives one.
    pub fn replay_id(&self) -> std::borrow::Cow<'_, str> {
        match &self.request {
            Some(digest) => format!("{}.{digest}", self.nonce).into(),
            None => self.nonce.as_str().into(),
        }
    }
}

/// An answer body with its content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// `application/json`, `text/plain`, …
    pub content_type: &'static str,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// A JSON answer.
    pub fn json(body: impl Into<Bytes>) -> Self {
        Self {
            content_type: "application/json",
            body: body.into(),
        }
    }

    /// An XML answer (WeCom's and WeChat's passive replies).
    pub fn xml(body: impl Into<Bytes>) -> Self {
        Self {
            content_type: "application/xml",
            body: body.into(),
        }
    }

    /// A plain-text answer (WeCom's echoed plaintext, WeChat's `success`, or an empty body).
    pub fn text(body: impl Into<Bytes>) -> Self {
        Self {
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

/// What one verified callback is.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// A URL-verification challenge: answer this at once, admit nothing.
    Challenge(Reply),
    /// A signed URL-verification challenge whose timestamp the signature covers (WeCom,
    /// WeChat): answered at once if the timestamp is within the replay window, so that a
    /// captured verification cannot be replayed for ever.
    SignedChallenge {
        /// The answer.
        answer: Reply,
        /// The request's signed timestamp, unix seconds.
        timestamp_secs: u64,
    },
    /// An event to admit; the platform gets its success answer once it is admitted.
    Admit {
        /// The admission.
        admit: Admit,
        /// The replay stamp, when the request carried one.
        stamp: Option<Stamp>,
    },
    /// A synchronous call (a card button): answered with the handler's result, through the
    /// claim protocol, within the platform's deadline; never re-delivered.
    Sync {
        /// The admission whose primary key is claimed.
        admit: Admit,
        /// The replay stamp, when the request carried one.
        stamp: Option<Stamp>,
    },
}

/// Where an event sits in its chat's version chain (WeCom's member versions): the version it
/// changed and the one it made. Creation times in whole seconds cannot order two changes of one
/// second; the chain can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// The version before the event (`LastMemVer`).
    pub before: String,
    /// The version after it (`CurMemVer`).
    pub after: String,
}

/// How the gateway answers an admitted callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Admitted now.
    Admitted,
    /// Seen before: nothing changed.
    Duplicate,
    /// Kept in the local spool while the store is unreachable.
    Spooled,
}

/// The class of a refusal: what it means for the sender, and so how HTTP says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalKind {
    /// Not authenticated: bad or missing signature or token, an unsigned request.
    Unauthenticated,
    /// The timestamp is outside the allowed skew.
    Stale,
    /// Authenticated but unusable: not JSON, unknown envelope, another app's event.
    BadInput,
    /// No such source or path.
    NotFound,
    /// The method is not one this source takes.
    Method,
    /// The body did not arrive in time.
    Timeout,
    /// The body is larger than the limit.
    TooLarge,
    /// The request's nonce was handled already.
    Replayed,
    /// The same call is being answered right now (a double click).
    InFlight,
    /// The key was used before for another payload: a caller's mistake, never retried.
    Conflict,
    /// The store cannot take it now (down, or the queue is full): retry later.
    Unavailable,
    /// A synchronous call's handler failed.
    Handler,
    /// A synchronous call's handler did not answer in time.
    HandlerTimeout,
}

/// Why a request was refused: its class, a short label for counters and logs, and a message
/// that says what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The class.
    pub kind: RefusalKind,
    /// A short, fixed label (`bad_signature`), for metrics.
    pub label: &'static str,
    /// What was wrong, for the sender and the log; never a secret or a payload.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind`.
    pub fn new(kind: RefusalKind, label: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            label,
            message: message.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

/// The HTTP method of a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET (WeCom and WeChat verify their URL with it).
    Get,
    /// POST.
    Post,
}

/// Looks up a request header by its lowercase name.
pub trait Headers: Sync {
    /// The header's value, if present and text.
    fn get(&self, name: &str) -> Option<&str>;
}

/// One HTTP callback as a source sees it: nothing is parsed yet.
#[derive(Clone, Copy)]
pub struct Callback<'a> {
    /// The method.
    pub method: Method,
    /// The raw query string (without `?`), if any.
    pub query: Option<&'a str>,
    /// The headers.
    pub headers: &'a dyn Headers,
    /// The body, as received.
    pub body: &'a [u8],
    /// The tenant the URL names (`/webhook/<source>/<tenant>`), when it names one: a source
    /// that serves many tenants checks the callback against that tenant's secrets only.
    pub tenant: Option<&'a str>,
}

/// A platform's webhook receiver: it turns one callback into a challenge answer, an admission
/// or a synchronous call, or refuses it; and says how to answer what was admitted. It checks
/// signatures and decrypts; it never sees a store.
pub trait WebhookSource: Send + Sync + 'static {
    /// The platform's name for logs (`feishu`, `wecom`, …).
    fn platform(&self) -> &str;

    /// Verifies and decodes one callback.
    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal>;

    /// The answer to an accepted event (Feishu: `{"msg":"success"}`, WeCom: an empty body).
    fn accepted(&self, how: Accepted) -> Reply;

    /// The answer to an accepted event of `event_type`, for a source that answers its kinds of
    /// events differently (a WeCom suite: `success` to its own pushes, the empty 200 to its
    /// corps' callbacks).
    fn accepted_as(&self, how: Accepted, event_type: &str) -> Reply {
        let _ = event_type;
        self.accepted(how)
    }

    /// The event's place in its chat's version chain, if its platform keeps one.
    fn versions(&self, event: &Event) -> Option<Versions> {
        let _ = event;
        None
    }

    /// The tenants this source serves, when it serves many (a WeCom suite's corps) and takes
    /// callbacks only from those: the gateway keeps the set current from the store's registry
    /// (`tenants:<source>`).
    fn tenants(&self) -> Option<std::sync::Arc<dyn TenantSet>> {
        None
    }

    /// What an admitted event of this source changes in its tenancy, as the platform says it
    /// (a WeCom suite's `suite_ticket` and `cancel_auth`): the gateway applies it to the store
    /// before the event goes to its route. `None` for every other event.
    fn tenancy(&self, event: &Event) -> Option<TenancyChange> {
        let _ = event;
        None
    }

    /// The payload routes get for `event` when it carries a credential the gateway keeps for
    /// itself (a WeCom suite's ticket or authorisation code, a Feishu store app's ticket): the
    /// same document with that value replaced by `redacted`, so that no sink, downstream or
    /// file holds it. `None`: the payload as it came.
    fn redacted(&self, event: &Event) -> Option<bytes::Bytes> {
        let _ = event;
        None
    }

    /// Whether the platform's own retries repeat a request byte for byte, nonce included
    /// (WeCom and WeChat): then a replayed nonce is answered like a duplicate instead of
    /// refused, so that a retry of an admitted event stops the retries. Nothing is admitted
    /// twice either way; the replay is still counted.
    fn retries_repeat_the_request(&self) -> bool {
        false
    }

    /// The answer to a synchronous call, from the handler's result (`None`: it had none), for
    /// the request stamped `request` (WeCom signs its encrypted replies with it).
    fn sync_reply(&self, result: Option<Bytes>, request: Option<&Stamp>) -> Reply {
        let _ = request;
        Reply::json(
            result
                .filter(|answer| !answer.is_empty())
                .unwrap_or_else(|| Bytes::from_static(b"{}")),
        )
    }

    /// [`WebhookSource::sync_reply`] for an event of app `app`, for a source whose apps differ by
    /// event (a WeCom suite seals each corp's reply for that corp).
    fn sync_reply_for(&self, result: Option<Bytes>, request: Option<&Stamp>, app: &str) -> Reply {
        let _ = app;
        self.sync_reply(result, request)
    }

    /// How long a synchronous call may take before its answer is late: the platform's wait,
    /// less the way back (Feishu waits 3 s for a card, WeCom and WeChat 5 s for a reply).
    fn sync_deadline(&self) -> std::time::Duration {
        std::time::Duration::from_millis(2_500)
    }
}

/// A synthetic message, for `oncegate simulate` and tests: what a platform would deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticMessage {
    /// The event id (and, prefixed, the message id).
    pub id: String,
    /// The chat it belongs to.
    pub chat: String,
    /// The sender.
    pub sender: String,
    /// The text.
    pub text: String,
    /// Creation time, unix milliseconds.
    pub created_ms: u64,
}

/// A synthetic change of a group's members, for `oncegate simulate` and tests: one member joins
/// or leaves, moving the group from version `before` to `after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticMembership {
    /// The group.
    pub chat: String,
    /// The member.
    pub member: String,
    /// Joined (or left).
    pub joined: bool,
    /// Creation time, unix milliseconds (the platforms keep whole seconds).
    pub created_ms: u64,
    /// The group's member version before the change.
    pub before: String,
    /// And after it.
    pub after: String,
}

/// A callback as a platform would send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedRequest {
    /// The method.
    pub method: Method,
    /// The query string, if any (signatures travel there on WeCom).
    pub query: Option<String>,
    /// The headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// The sending side of a platform, for load generators and tests: builds a message's plaintext
/// and seals it (signs, encrypts) as the platform would, with a fresh timestamp and nonce each
/// time.
pub trait Sealer: Send + Sync + 'static {
    /// The plaintext document of a message event.
    fn message(&self, message: &SyntheticMessage) -> Vec<u8>;

    /// The plaintext document of a member change, if the platform reports them.
    fn membership(&self, change: &SyntheticMembership) -> Option<Vec<u8>> {
        let _ = change;
        None
    }

    /// `plaintext` as a signed request at `timestamp_secs` with `nonce` (and `iv` where the
    /// platform encrypts).
    fn seal(
        &self,
        plaintext: &[u8],
        timestamp_secs: u64,
        nonce: &str,
        iv: [u8; 16],
    ) -> SealedRequest;
}

/// Where a transport that is not a webhook (a long connection) hands its events: the gateway's
/// one admission path and its claim protocol, as for callbacks.
pub trait Inlet: Send + Sync + 'static {
    /// Admits one event; `Ok` once it is recorded (or was already), `Err` if it was not (the
    /// platform is then told so, and redelivers it).
    fn admit(&self, admit: Admit) -> impl Future<Output = Result<Accepted, Refusal>> + Send;

    /// Answers one synchronous call (a card action) within `deadline`: the handler's answer,
    /// or the stored answer of an earlier run.
    fn call(
        &self,
        admit: Admit,
        deadline: std::time::Duration,
    ) -> impl Future<Output = Result<Option<Bytes>, Refusal>> + Send;

    /// Whether `event` is answered by its handler over the connection (its route has
    /// `reply = true`): it goes through [`Inlet::reply`] instead of [`Inlet::admit`].
    fn replies(&self, event: &Event) -> bool {
        let _ = event;
        false
    }

    /// Runs the handler of a replying event once, through the claim protocol, within
    /// `deadline`, handing a streamed answer's pieces to `updates` as they come. A repeat of an
    /// event run before, or running now, starts nothing: [`Replied::Repeat`]. The reply is
    /// counted in `budgets` (bucket names within the app, as `/send` names its own, and their
    /// rates: the platform's per-conversation limit, which sends share) before the handler runs.
    /// The handler's answer goes to `deliver`, and the event is settled by what it says: done
    /// once the answer reached the platform (or may have), retryable when it did not.
    fn reply(
        &self,
        admit: Admit,
        deadline: std::time::Duration,
        budgets: Vec<(String, crate::Rate)>,
        updates: Updates,
        deliver: Deliver,
    ) -> impl Future<Output = Result<Replied, Refusal>> + Send {
        let _ = (admit, deadline, budgets, updates, deliver);
        async {
            Err(Refusal::new(
                RefusalKind::Unavailable,
                "no_replies",
                "this inlet does not answer events",
            ))
        }
    }

    /// Notes a failure or refusal for the rate-limited log (never one line per frame).
    fn note(&self, label: &'static str, message: &str);
}

/// Where the pieces of a streamed answer go as they come (each a piece of content to append).
pub type Updates = std::sync::Arc<dyn Fn(Bytes) + Send + Sync>;

/// Sends a replying event's whole answer (after its pieces went to [`Updates`]) over the
/// transport and says whether it reached the platform; called at most once, after the handler
/// answered and before the event's claim is settled.
pub type Deliver =
    Box<dyn FnOnce(Option<Bytes>) -> std::pin::Pin<Box<dyn Future<Output = Sent> + Send>> + Send>;

/// Whether a replying event's answer reached the platform: how its claim is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The platform took it: the event is done.
    Yes,
    /// It went out and no answer came: it may be on the user's screen, so it is not sent
    /// again and the event is done (said in the log).
    Unknown,
    /// It never reached the platform (no connection took it, or the platform refused it): the
    /// event stays retryable, so that a repeat of it is answered.
    No,
}

/// How a replying event's handler run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replied {
    /// This call ran the handler: its whole answer (none: nothing to send).
    Answer(Option<Bytes>),
    /// The event was answered before or is being answered now: nothing to send.
    Repeat,
}
