//! Commands against a running gateway's admin listener: dead letters (`dlq`) and `status`
//! (`queue` is in `queue_cmd`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

/// Where the gateway's admin listener is and how to get in.
#[derive(Debug, Args)]
pub(crate) struct Admin {
    /// The gateway's configuration: its server.admin_listen and server.admin_token.
    #[arg(long, env = "ONCEGATE_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// The admin listener's URL (overrides the configuration), e.g. http://127.0.0.1:9090.
    #[arg(long, env = "ONCEGATE_ADMIN_URL", global = true)]
    admin: Option<String>,
    /// The admin token (overrides the configuration's server.admin_token).
    #[arg(
        long,
        env = "ONCEGATE_ADMIN_TOKEN",
        global = true,
        hide_env_values = true
    )]
    token: Option<String>,
    /// Print the gateway's JSON answer instead of a summary.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

impl Admin {
    /// Where a command that is not `dlq` or `status` finds the gateway.
    pub(crate) fn new(
        config: Option<PathBuf>,
        admin: Option<String>,
        token: Option<String>,
    ) -> Self {
        Self {
            config,
            admin,
            token,
            json: false,
        }
    }
}

/// `oncegate status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    admin: Admin,
}

pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    pub(crate) fn new(admin: &Admin) -> anyhow::Result<Self> {
        // The configuration is read only for what the flags leave out.
        let config = match (&admin.admin, &admin.token) {
            (Some(_), Some(_)) => None,
            _ => Some(crate::load(admin.config.as_deref())?),
        };
        let base = match (&admin.admin, &config) {
            (Some(url), _) => url.trim_end_matches('/').to_owned(),
            (None, Some(config)) => format!("http://{}", config.server.admin_listen),
            (None, None) => bail!("name the gateway: --admin URL or --config FILE"),
        };
        let token = match (
            &admin.token,
            config.as_ref().and_then(|c| c.server.admin_token.as_ref()),
        ) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(secret)) => Some(
                secret
                    .resolve()
                    .map_err(|error| anyhow::anyhow!("server.admin_token: {error}"))?,
            ),
            (None, None) => None,
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self { http, base, token })
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request
            .send()
            .await
            .with_context(|| format!("no answer from the gateway's admin listener at {}: is it running? (--admin, server.admin_listen)", self.base))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .context("reading the gateway's answer")?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status == 401 {
            bail!(
                "the gateway wants its admin token: --token, ONCEGATE_ADMIN_TOKEN or server.admin_token in --config"
            );
        }
        Ok((status, body))
    }

    pub(crate) async fn get(
        &self,
        path: &str,
        query: &[(&str, &String)],
    ) -> anyhow::Result<(u16, Value)> {
        self.call(self.http.get(format!("{}{path}", self.base)).query(query))
            .await
    }

    /// `method` on the path made of `segments`, each percent-encoded (ids that go into a URL),
    /// with `body` as JSON when given.
    pub(crate) async fn at(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut url = reqwest::Url::parse(&self.base)
            .with_context(|| format!("the admin URL {:?}", self.base))?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("the admin URL {:?} takes no path", self.base))?
            .pop_if_empty()
            .extend(segments);
        let request = self.http.request(method, url).query(query);
        let request = match body {
            Some(body) => request.json(body),
            None => request,
        };
        self.call(request).await
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let (status, answer) = self
            .call(self.http.post(format!("{}{path}", self.base)).json(body))
            .await?;
        if status != 200 {
            bail!("{path}: {status} {}", error_of(&answer));
        }
        Ok(answer)
    }
}

pub(crate) fn error_of(answer: &Value) -> String {
    answer["error"]
        .as_str()
        .map_or_else(|| answer.to_string(), str::to_owned)
}

pub(crate) fn print_json(value: &Value) -> std::io::Result<()> {
    out!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    )
}

/// One key's whole story from a running gateway (any store): its record, its lease, and its
/// dead letter if it died. `false` when the gateway has not seen it.
pub(crate) async fn record(
    admin: Admin,
    query: Vec<(&'static str, String)>,
) -> anyhow::Result<bool> {
    let client = Client::new(&admin)?;
    let query: Vec<(&str, &String)> = query.iter().map(|(k, v)| (*k, v)).collect();
    let (status, answer) = client.get("/admin/record", &query).await?;
    match status {
        200 => {}
        404 => {
            out!("not seen (or forgotten after its retention)")?;
            return Ok(false);
        }
        _ => bail!("/admin/record: {status} {}", error_of(&answer)),
    }
    let record = &answer["record"];
    // Times as spans from now, not the epoch milliseconds the API answers with.
    let now_ms = oncegate_core::Clock::now_ms(&oncegate_core::SystemClock);
    let left = |at: &Value| {
        at.as_u64()
            .map_or("?".to_owned(), |at| crate::span(at.saturating_sub(now_ms)))
    };
    let ago = |at: &Value| {
        at.as_u64()
            .map_or("?".to_owned(), |at| crate::span(now_ms.saturating_sub(at)))
    };
    out!("key          {}", answer["key"].as_str().unwrap_or(""))?;
    out!("partition    {}", answer["partition"])?;
    let state = record["state"].as_str().unwrap_or("");
    match state {
        "processing" => out!(
            "state        processing (lease token {}, {} left)",
            record["token"],
            left(&record["lease_until_ms"])
        )?,
        "completed" => out!(
            "state        completed ({} byte outcome)",
            record["outcome_bytes"].as_u64().unwrap_or(0)
        )?,
        other => out!("state        {other}")?,
    }
    if let Some(note) = answer["note"].as_str() {
        out!("note         {note}")?;
    }
    out!("kept         {} more", left(&answer["expires_at_ms"]))?;
    if let Some(fingerprint) = answer["fingerprint"].as_str() {
        out!("fingerprint  {fingerprint}")?;
    }
    if let Some(letter) = answer["dead_letter"].as_object() {
        out!(
            "dead letter  {} after {} attempts, {} ago: {}",
            letter["id"].as_str().unwrap_or(""),
            letter["attempts"],
            ago(&letter["at_ms"]),
            letter["reason"].as_str().unwrap_or("")
        )?;
    }
    // This gateway's attempts of an event that did not go through at once.
    for attempt in answer["attempts"].as_array().into_iter().flatten() {
        let next = match attempt["next_at_ms"].as_u64() {
            Some(_) => format!(", next in {}", left(&attempt["next_at_ms"])),
            None => String::new(),
        };
        out!(
            "attempt {:<4} {} ago, {} ms, {}{next}{}",
            attempt["attempt"],
            ago(&attempt["at_ms"]),
            attempt["latency_ms"],
            attempt["outcome"].as_str().unwrap_or(""),
            attempt["error"]
                .as_str()
                .map(|error| format!(": {error}"))
                .unwrap_or_default()
        )?;
    }
    Ok(true)
}

/// The checks of a `/readyz` answer that fail, as "check: detail".
fn failed_checks(ready: &Value) -> Vec<String> {
    ready["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["ok"] != true)
        .map(|c| {
            format!(
                "{}: {}",
                c["check"].as_str().unwrap_or(""),
                c["detail"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Whether a running gateway is ready (`/readyz` answers 200): for a container's healthcheck,
/// which has no shell or curl in an image made from scratch. `false` when it is not, with the
/// checks that fail; an error when it does not answer.
pub(crate) async fn ready(args: StatusArgs) -> anyhow::Result<bool> {
    let client = Client::new(&args.admin)?;
    let (status, ready) = client.get("/readyz", &[]).await?;
    if args.admin.json {
        // The probe's own answer, for a script: the exit code says ready or not all the same.
        print_json(&ready)?;
        return Ok(status == 200);
    }
    if status == 200 {
        let failed = failed_checks(&ready);
        if failed.is_empty() {
            out!("ready")?;
        } else {
            out!("ready, degraded: {}", failed.join("; "))?;
        }
        return Ok(true);
    }
    out!("not ready ({status}): {}", failed_checks(&ready).join("; "))?;
    Ok(false)
}

/// `oncegate reload`: the gateway reads its configuration file again and puts its dynamic part
/// in force (as SIGHUP does), or changes nothing and says why.
pub(crate) async fn reload(args: StatusArgs) -> anyhow::Result<bool> {
    let client = Client::new(&args.admin)?;
    let (status, answer) = client
        .at(reqwest::Method::POST, &["admin", "reload"], &[], None)
        .await?;
    if status != 200 {
        out!("not reloaded ({status}): {}", error_of(&answer))?;
        return Ok(false);
    }
    if args.admin.json {
        print_json(&answer)?;
        return Ok(true);
    }
    let reloaded = &answer["reloaded"];
    for part in ["sources", "routes"] {
        let changes = &reloaded[part];
        let names = |what: &str| {
            changes[what]
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default()
        };
        out!(
            "{part}: {} kept; added: [{}]; changed: [{}]; removed: [{}]",
            changes["kept"],
            names("added"),
            names("changed"),
            names("removed")
        )?;
    }
    out!("reloaded")?;
    Ok(true)
}

pub(crate) async fn status(args: StatusArgs) -> anyhow::Result<bool> {
    let client = Client::new(&args.admin)?;
    let (ready_status, ready) = client.get("/readyz", &[]).await?;
    let (status, stats) = client.get("/admin/stats", &[]).await?;
    if status != 200 {
        bail!("/admin/stats: {status} {}", error_of(&stats));
    }
    if args.admin.json {
        print_json(&json!({"ready": ready_status == 200, "readyz": ready, "stats": stats}))?;
        return Ok(ready_status == 200);
    }
    let checks = ready["checks"].as_array().cloned().unwrap_or_default();
    let failed = failed_checks(&ready);
    out!("gateway      {}", client.base)?;
    match (ready_status == 200, failed.is_empty()) {
        (true, true) => out!("ready        true ({} checks pass)", checks.len())?,
        // Ready (it takes events) with a part down: a long connection beside webhooks.
        (true, false) => out!("ready        true, degraded: {}", failed.join("; "))?,
        (false, _) => out!("ready        false ({})", failed.join("; "))?,
    }
    // What the store's mode or the configuration can lose, as /readyz says it: never silent.
    for check in &checks {
        if let Some(risk) = check["at_risk"].as_str() {
            out!(
                "at risk      {}: {risk}",
                check["check"].as_str().unwrap_or("")
            )?;
        }
    }
    let gateway = &stats["gateway"];
    let n = |v: &Value, name: &str| v[name].as_u64().unwrap_or(0);
    // Requests count HTTP only; admissions count every transport (long connections too).
    out!(
        "events       admitted {}, duplicates {} (webhooks and long connections)\n\
         requests     {} over HTTP, refused {}",
        n(gateway, "admitted"),
        n(gateway, "duplicates"),
        n(gateway, "requests"),
        n(gateway, "bad_requests")
            + n(gateway, "replays_rejected")
            + n(gateway, "stale_timestamps"),
    )?;
    out!(
        "delivered    {} (retries {}, dead-lettered {} since this start, stale dropped {})",
        n(gateway, "delivered"),
        n(gateway, "retries"),
        n(gateway, "dead_letters"),
        n(gateway, "stale_dropped"),
    )?;
    match client.get("/admin/queue", &[]).await {
        Ok((200, queue)) => {
            out!("{}", crate::queue_cmd::queue_line(&queue))?;
            if let Some(owners) = crate::queue_cmd::owners_line(&queue) {
                out!("{owners}")?;
            }
        }
        Ok((status, answer)) => out!("queue        {status} {}", error_of(&answer))?,
        Err(error) => out!("queue        {error}")?,
    }
    let store = &stats["store"];
    if store.is_object() {
        out!(
            "store        queued {}, in flight {}, dead letters kept {} (earlier runs' included)\nremembered   {} keys waiting (with message-id aliases and dead-lettered events' keys), {} processing, {} done: kept for dedup.retention, not a backlog",
            n(store, "queued"),
            n(store, "in_flight"),
            n(store, "dead_letters"),
            n(store, "pending"),
            n(store, "processing"),
            n(store, "completed"),
        )?;
    } else {
        out!("store        not answering")?;
    }
    for connection in stats["long_connections"].as_array().into_iter().flatten() {
        let last = match connection["last_frame_age_ms"].as_u64() {
            Some(age) => format!("last frame {age} ms ago"),
            None => "no frame yet".to_owned(),
        };
        out!(
            "long conn    {} {}: {} open, {} reconnects, {last}{}",
            connection["source"].as_str().unwrap_or(""),
            connection["role"].as_str().unwrap_or(""),
            connection["open"],
            connection["reconnects"],
            connection["fatal"]
                .as_str()
                .map(|f| format!(", stopped: {f}"))
                .unwrap_or_default(),
        )?;
    }
    Ok(ready_status == 200)
}
