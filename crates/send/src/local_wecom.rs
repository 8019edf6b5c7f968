//! A WeCom-like message API on loopback, for tests: tokens (40014 for a stale one), a cap on
//! calls in flight (45033), corps whose quota is spent (45009), WeCom's silent drop past 30 messages per minute to one member, and
//! a count of what it really delivered. With [`LocalWecomApi::serve_suite`] it is also a
//! suite's ISV API (`shared/protocols/tenants.md` §1.3): suite tokens for the ticket it issued
//! last, one-use authorisation codes exchanged for permanent codes, each corp's authorisation as it
//! stands (its agent, which a `change_auth` may change, the only one its sends may name), and
//! each corp's tokens,
//! each send recorded with the corp whose token it carried.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Query, State};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;

#[derive(Default)]
struct Inner {
    /// Live tokens, each with its corp.
    tokens: HashMap<String, String>,
    tokens_issued: u64,
    delivered: Vec<(String, Instant)>,
    /// Each accepted call's body, in order, with the corp whose token it carried.
    bodies: Vec<(String, String)>,
    dropped: u64,
    busy: u64,
    /// Corps whose sends are answered 45009 (another system spent their quota), and how many
    /// each was answered.
    blocked: HashMap<String, u64>,
    /// Calls in flight at once per corp, where WeCom counts them per corp
    /// (`limit_corp_in_flight`), and each corp's now.
    corp_in_flight_max: Option<usize>,
    corp_in_flight: HashMap<String, usize>,
    suite: Option<Suite>,
}

/// A suite served by the same server.
#[derive(Default)]
struct Suite {
    id: String,
    secret: String,
    /// The ticket pushed last: the only one `get_suite_token` takes.
    ticket: Option<String>,
    tickets: u64,
    suite_tokens: Vec<String>,
    /// Authorisation codes not yet exchanged: code → (corp, agent).
    codes: HashMap<String, (String, i64)>,
    /// Permanent codes: code → corp.
    permanent: HashMap<String, String>,
    /// The suite's agent in each authorised corp: a send as the corp names it (40056 else).
    agents: HashMap<String, i64>,
    /// Calls to each of the suite's endpoints, by path.
    calls: HashMap<&'static str, u64>,
}

struct Shared {
    corp_id: String,
    secret: String,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The server; it stops when dropped.
pub struct LocalWecomApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LocalWecomApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LocalWecomApi {
    /// Serves corp `corp_id`'s app with `secret`, allowing `max_in_flight` calls at once.
    pub async fn start(corp_id: &str, secret: &str, max_in_flight: usize) -> std::io::Result<Self> {
        Self::start_at("127.0.0.1:0", corp_id, secret, max_in_flight).await
    }

    /// `start`, listening on `address` (`oncegate simulate --platform-api` serves a source's
    /// configured domain).
    pub async fn start_at(
        address: &str,
        corp_id: &str,
        secret: &str,
        max_in_flight: usize,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(address).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            corp_id: corp_id.to_owned(),
            secret: secret.to_owned(),
            max_in_flight,
            in_flight: AtomicUsize::new(0),
            inner: Mutex::new(Inner::default()),
        });
        let router = axum::Router::new()
            .route("/cgi-bin/gettoken", get(token))
            .route("/cgi-bin/message/send", post(send))
            .route("/cgi-bin/service/get_suite_token", post(suite_token))
            .route("/cgi-bin/service/get_permanent_code", post(permanent_code))
            .route("/cgi-bin/service/get_corp_token", post(corp_token))
            .route("/cgi-bin/service/get_auth_info", post(auth_info))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self { shared, addr, task })
    }

    /// The domain to configure.
    pub fn domain(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Tokens issued so far.
    pub fn tokens_issued(&self) -> u64 {
        self.shared.lock().tokens_issued
    }

    /// Makes every current token invalid.
    pub fn expire_token(&self) {
        self.shared.lock().tokens.clear();
    }

    /// Serves suite `suite_id` with `secret` too.
    pub fn serve_suite(&self, suite_id: &str, secret: &str) {
        self.shared.lock().suite = Some(Suite {
            id: suite_id.to_owned(),
            secret: secret.to_owned(),
            ..Suite::default()
        });
    }

    /// A new suite ticket, the only one taken from now on: what WeCom pushes every 10 minutes.
    pub fn issue_ticket(&self) -> String {
        let mut inner = self.shared.lock();
        let suite = inner.suite.get_or_insert_with(Suite::default);
        suite.tickets += 1;
        let ticket = format!("ticket-{}", suite.tickets);
        suite.ticket = Some(ticket.clone());
        ticket
    }

    /// Corp `corp_id` authorises the suite (its agent `agent_id`): the one-use code its
    /// `create_auth` push carries.
    pub fn authorise(&self, corp_id: &str, agent_id: i64) -> String {
        let mut inner = self.shared.lock();
        let suite = inner.suite.get_or_insert_with(Suite::default);
        let code = format!(
            "auth-{corp_id}-{}",
            suite.codes.len() + suite.permanent.len()
        );
        suite
            .codes
            .insert(code.clone(), (corp_id.to_owned(), agent_id));
        code
    }

    /// Corp `corp_id` changes what it authorised (what its `change_auth` push tells): the
    /// suite's agent in it is now `agent_id`, the only one its sends may name.
    pub fn change_agent(&self, corp_id: &str, agent_id: i64) {
        let mut inner = self.shared.lock();
        let suite = inner.suite.get_or_insert_with(Suite::default);
        suite.agents.insert(corp_id.to_owned(), agent_id);
    }

    /// Calls made to the suite endpoint `path` (`get_suite_token`, `get_permanent_code`,
    /// `get_corp_token`, `get_auth_info`).
    pub fn suite_calls(&self, path: &str) -> u64 {
        self.shared
            .lock()
            .suite
            .as_ref()
            .and_then(|suite| suite.calls.get(path).copied())
            .unwrap_or(0)
    }

    /// Every accepted send, in order: the corp whose token it carried and its body.
    pub fn sends(&self) -> Vec<(String, String)> {
        self.shared.lock().bodies.clone()
    }

    /// Messages delivered to `member`.
    pub fn delivered_to(&self, member: &str) -> usize {
        self.shared
            .lock()
            .delivered
            .iter()
            .filter(|(to, _)| to == member)
            .count()
    }

    /// The bodies of the calls answered with success, in order, from the `from`th on.
    pub fn bodies_from(&self, from: usize) -> Vec<String> {
        self.shared
            .lock()
            .bodies
            .iter()
            .skip(from)
            .map(|(_, body)| body.clone())
            .collect()
    }

    /// Messages WeCom answered with success and did not deliver (over 30 per minute to one
    /// member).
    pub fn dropped(&self) -> u64 {
        self.shared.lock().dropped
    }

    /// Calls answered 45033 (too many in flight).
    pub fn busy(&self) -> u64 {
        self.shared.lock().busy
    }

    /// Answers `corp`'s sends 45009 from now on, as WeCom does when the corp's quota is spent
    /// (by another system sending as it): the call counts, nothing is sent.
    pub fn block(&self, corp: &str) {
        self.shared
            .lock()
            .blocked
            .entry(corp.to_owned())
            .or_default();
    }

    /// Answers 45033 to a corp's call while `max` of its calls are in flight (WeCom's
    /// concurrency limits are per API and, as far as anyone reports, per corp).
    pub fn limit_corp_in_flight(&self, max: usize) {
        self.shared.lock().corp_in_flight_max = Some(max);
    }

    /// `corp`'s sends answered 45009 so far.
    pub fn blocked_calls(&self, corp: &str) -> u64 {
        self.shared.lock().blocked.get(corp).copied().unwrap_or(0)
    }
}

async fn token(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Json<Value> {
    let mut inner = shared.lock();
    let (corp, secret) = (query.get("corpid"), query.get("corpsecret"));
    // A 代开发 app's secret is its permanent code.
    let permanent = inner
        .suite
        .as_ref()
        .and_then(|suite| suite.permanent.get(secret?))
        .is_some_and(|owner| Some(owner) == corp);
    let own = corp == Some(&shared.corp_id) && secret == Some(&shared.secret);
    match (own || permanent, corp) {
        (true, Some(corp)) => Json(issue(&mut inner, corp.clone())),
        _ => Json(json!({"errcode": 40001, "errmsg": "invalid credential"})),
    }
}

/// A new token for `corp`, valid until `expire_token`.
fn issue(inner: &mut Inner, corp: String) -> Value {
    inner.tokens_issued += 1;
    let token = format!("wecom-token-{}", inner.tokens_issued);
    inner.tokens.insert(token.clone(), corp);
    json!({"errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": 7200})
}

/// The suite, counting the call to `path`, or WeCom's refusal when none is served.
fn suite_of<'a>(inner: &'a mut Inner, path: &'static str) -> Result<&'a mut Suite, Value> {
    let suite = inner
        .suite
        .as_mut()
        .ok_or_else(|| json!({"errcode": 40001, "errmsg": "no suite here"}))?;
    *suite.calls.entry(path).or_default() += 1;
    Ok(suite)
}

async fn suite_token(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Json<Value> {
    let mut inner = shared.lock();
    let suite = match suite_of(&mut inner, "get_suite_token") {
        Ok(suite) => suite,
        Err(refusal) => return Json(refusal),
    };
    if body["suite_id"].as_str() != Some(&suite.id)
        || body["suite_secret"].as_str() != Some(&suite.secret)
    {
        return Json(json!({"errcode": 40001, "errmsg": "invalid suite credential"}));
    }
    if suite.ticket.is_none() || body["suite_ticket"].as_str() != suite.ticket.as_deref() {
        return Json(json!({"errcode": 40085, "errmsg": "invalid suite ticket"}));
    }
    let token = format!("suite-token-{}", suite.suite_tokens.len() + 1);
    suite.suite_tokens.push(token.clone());
    // As WeCom: no errcode on success.
    Json(json!({"suite_access_token": token, "expires_in": 7200}))
}

/// Whether `query` carries a suite token the suite issued.
fn suite_token_of(suite: &Suite, query: &HashMap<String, String>) -> bool {
    query
        .get("suite_access_token")
        .is_some_and(|token| suite.suite_tokens.contains(token))
}

async fn permanent_code(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let mut inner = shared.lock();
    let suite = match suite_of(&mut inner, "get_permanent_code") {
        Ok(suite) => suite,
        Err(refusal) => return Json(refusal),
    };
    if !suite_token_of(suite, &query) {
        return Json(json!({"errcode": 42009, "errmsg": "suite_access_token expired"}));
    }
    // One use: a second exchange of the same code is refused.
    let Some((corp, agent)) = body["auth_code"]
        .as_str()
        .and_then(|code| suite.codes.remove(code))
    else {
        return Json(json!({"errcode": 40078, "errmsg": "invalid auth_code"}));
    };
    let permanent = format!("permanent-{corp}-{}", suite.permanent.len() + 1);
    suite.permanent.insert(permanent.clone(), corp.clone());
    suite.agents.insert(corp.clone(), agent);
    let mut answer = authorisation(&corp, agent);
    answer["access_token"] = json!("unused");
    answer["expires_in"] = json!(7200);
    answer["permanent_code"] = json!(permanent);
    Json(answer)
}

/// What WeCom says of a corp's authorisation (`get_permanent_code`, `get_auth_info`).
fn authorisation(corp: &str, agent: i64) -> Value {
    json!({
        "auth_corp_info": {"corpid": corp, "corp_name": format!("Corp {corp}")},
        "auth_info": {"agent": [{"agentid": agent, "name": "app"}]},
    })
}

/// The corp a call's `auth_corpid` and `permanent_code` name, or WeCom's refusal.
fn corp_of(suite: &Suite, body: &Value) -> Result<String, Value> {
    let corp = body["auth_corpid"].as_str().unwrap_or_default();
    let owner = body["permanent_code"]
        .as_str()
        .and_then(|code| suite.permanent.get(code));
    if owner.map(String::as_str) != Some(corp) {
        return Err(json!({"errcode": 40084, "errmsg": "invalid permanent_code"}));
    }
    Ok(corp.to_owned())
}

async fn auth_info(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let mut inner = shared.lock();
    let suite = match suite_of(&mut inner, "get_auth_info") {
        Ok(suite) => suite,
        Err(refusal) => return Json(refusal),
    };
    if !suite_token_of(suite, &query) {
        return Json(json!({"errcode": 42009, "errmsg": "suite_access_token expired"}));
    }
    match corp_of(suite, &body) {
        Ok(corp) => {
            let agent = suite.agents.get(&corp).copied().unwrap_or_default();
            Json(authorisation(&corp, agent))
        }
        Err(refusal) => Json(refusal),
    }
}

async fn corp_token(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let mut inner = shared.lock();
    let corp = {
        let suite = match suite_of(&mut inner, "get_corp_token") {
            Ok(suite) => suite,
            Err(refusal) => return Json(refusal),
        };
        if !suite_token_of(suite, &query) {
            return Json(json!({"errcode": 42009, "errmsg": "suite_access_token expired"}));
        }
        match corp_of(suite, &body) {
            Ok(corp) => corp,
            Err(refusal) => return Json(refusal),
        }
    };
    Json(issue(&mut inner, corp))
}

async fn send(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let now_in_flight = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let answer = answer(&shared, &query, &body, now_in_flight).await;
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    Json(answer)
}

async fn answer(
    shared: &Shared,
    query: &HashMap<String, String>,
    body: &Value,
    in_flight: usize,
) -> Value {
    if in_flight > shared.max_in_flight {
        shared.lock().busy += 1;
        return json!({"errcode": 45033, "errmsg": "api concurrent out of limit"});
    }
    let corp_slot = {
        let mut inner = shared.lock();
        let corp = query
            .get("access_token")
            .and_then(|token| inner.tokens.get(token))
            .cloned();
        match (inner.corp_in_flight_max, corp) {
            (Some(max), Some(corp)) => {
                if inner.corp_in_flight.get(&corp).copied().unwrap_or(0) >= max {
                    inner.busy += 1;
                    return json!({"errcode": 45033, "errmsg": "api concurrent out of limit"});
                }
                *inner.corp_in_flight.entry(corp.clone()).or_default() += 1;
                Some(corp)
            }
            _ => None,
        }
    };
    // Every call takes a little while, so that concurrency shows.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut inner = shared.lock();
    if let Some(count) = corp_slot
        .as_ref()
        .and_then(|corp| inner.corp_in_flight.get_mut(corp))
    {
        *count -= 1;
    }
    let Some(corp) = query
        .get("access_token")
        .and_then(|token| inner.tokens.get(token))
        .cloned()
    else {
        return json!({"errcode": 40014, "errmsg": "invalid access_token"});
    };
    // A suite's corp sends as the agent it authorised now, no other.
    let authorised = inner
        .suite
        .as_ref()
        .and_then(|suite| suite.agents.get(&corp));
    if authorised.is_some_and(|agent| body["agentid"].as_i64() != Some(*agent)) {
        return json!({"errcode": 40056, "errmsg": "invalid agentid"});
    }
    if let Some(calls) = inner.blocked.get_mut(&corp) {
        *calls += 1;
        return json!({"errcode": 45009, "errmsg": "api freq out of limit, hint: [local]"});
    }
    let now = Instant::now();
    inner.bodies.push((corp, body.to_string()));
    for member in body["touser"]
        .as_str()
        .unwrap_or("")
        .split('|')
        .filter(|m| !m.is_empty())
    {
        let last_minute = inner
            .delivered
            .iter()
            .filter(|(to, at)| to == member && now.duration_since(*at) < Duration::from_secs(60))
            .count();
        if last_minute >= 30 {
            // WeCom's own behaviour: success, and the message never arrives.
            inner.dropped += 1;
        } else {
            inner.delivered.push((member.to_owned(), now));
        }
    }
    json!({"errcode": 0, "errmsg": "ok", "msgid": format!("wecom-msg-{}", inner.delivered.len())})
}
