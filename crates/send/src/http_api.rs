//! Any platform's message API by configuration: a JSON `POST` to a URL with fixed headers, the
//! platform's idempotency key written where the API reads it (`client_msg_id`, Discord's
//! `nonce` with `enforce_nonce`), fields every call carries, and the answers classed by what a
//! retry may do — sent, not sent (retry), or unknown (only a retry with the same key is safe).

use std::time::Duration;

use serde_json::Value;

use crate::{Budget, SendError};

/// What a generic message API is.
#[derive(Clone)]
pub struct HttpApiSpec {
    /// The URL the caller's body is posted to.
    pub url: String,
    /// Headers of every call (an `Authorization`): values, resolved.
    pub headers: Vec<(String, String)>,
    /// JSON pointers the platform's idempotency key is written at; none: the API takes no key.
    pub key_at: Vec<String>,
    /// The longest key the API takes (Discord's `nonce`: 25); the key is cut to it.
    pub key_max: usize,
    /// Fields every call carries, by JSON pointer (`/enforce_nonce` = true).
    pub set: Vec<(String, Value)>,
    /// Whether the API drops a second call carrying a key it has seen: then, after an unknown
    /// outcome, a retry under the same key may call again; without it the key is settled.
    pub dedups: bool,
    /// Where the API's own result code is in its answer (`/errcode`) and the codes that mean
    /// sent; `None`: any 2xx is sent.
    pub ok_at: Option<(String, Vec<Value>)>,
    /// Codes at that place that mean "over a limit, nothing sent: retry later".
    pub retry_codes: Vec<Value>,
    /// Where the receiver is in the caller's body (`/channel_id`): its sends share a budget.
    pub receiver_at: Option<String>,
    /// The budget of one receiver's sends.
    pub per_receiver: Option<Budget>,
    /// The budget of every send of this API.
    pub per_app: Option<Budget>,
}

impl std::fmt::Debug for HttpApiSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are secrets: only their names.
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("HttpApiSpec")
            .field("url", &oncegate_core::redact::url(&self.url))
            .field("headers", &headers)
            .field("key_at", &self.key_at)
            .finish_non_exhaustive()
    }
}

/// A generic message API ([`HttpApiSpec`]) as a sender.
pub struct HttpApi {
    http: reqwest::Client,
    spec: HttpApiSpec,
    scope: String,
}

impl std::fmt::Debug for HttpApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpApi")
            .field("spec", &self.spec)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// A caller's send, ready for a generic API.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpMessage {
    /// The body posted: the caller's, with the key and the fixed fields written in.
    pub body: Value,
}

/// Sets `value` at the JSON pointer `pointer` in `document`, making the objects on the way.
fn set_at(document: &mut Value, pointer: &str, value: Value) -> Result<(), String> {
    let mut at = document;
    let parts: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|part| part.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, path)) = parts.split_last() else {
        return Err(format!("{pointer:?} is not a JSON pointer to a field"));
    };
    for part in path {
        if at.is_null() {
            *at = Value::Object(serde_json::Map::new());
        }
        at = at
            .as_object_mut()
            .ok_or_else(|| format!("{pointer:?}: {part:?} is inside something not an object"))?
            .entry(part.clone())
            .or_insert(Value::Null);
    }
    if at.is_null() {
        *at = Value::Object(serde_json::Map::new());
    }
    at.as_object_mut()
        .ok_or_else(|| format!("{pointer:?}: the field's parent is not an object"))?
        .insert(last.clone(), value);
    Ok(())
}

impl HttpApi {
    /// The API `spec`, its budgets named by `scope` (the source's app), calls bounded by
    /// `timeout`.
    pub fn new(spec: HttpApiSpec, scope: &str, timeout: Duration) -> Result<Self, String> {
        if !(spec.url.starts_with("https://") || spec.url.starts_with("http://")) {
            return Err(format!(
                "url {:?} is not an http(s) URL",
                oncegate_core::redact::url(&spec.url)
            ));
        }
        for pointer in spec.key_at.iter().chain(spec.set.iter().map(|(p, _)| p)) {
            if !pointer.starts_with('/') || pointer.len() < 2 {
                return Err(format!(
                    "{pointer:?} is not a JSON pointer to a field (/client_msg_id)"
                ));
            }
        }
        if spec.key_max < 8 {
            return Err(format!(
                "key_max = {}: a key of fewer than 8 characters would make two sends alike",
                spec.key_max
            ));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| format!("HTTP client: {error}"))?;
        Ok(Self {
            http,
            spec,
            scope: scope.to_owned(),
        })
    }

    /// What its budgets are named by.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Whether a retry under the same key after an unknown outcome may call again.
    pub fn repeat_safe(&self) -> bool {
        self.spec.dedups && !self.spec.key_at.is_empty()
    }

    /// The caller's `body` with `platform_key` and the fixed fields written in, and the
    /// budgets it spends (the receiver's first).
    pub fn prepare(
        &self,
        body: Value,
        platform_key: &str,
    ) -> Result<(HttpMessage, Vec<(String, Budget)>), String> {
        if !body.is_object() {
            return Err("the body is the API's own JSON object".into());
        }
        let mut budgets = Vec::new();
        if let (Some(at), Some(budget)) = (&self.spec.receiver_at, self.spec.per_receiver) {
            let receiver = match body.pointer(at) {
                Some(Value::String(text)) if !text.is_empty() => text.clone(),
                Some(Value::Number(number)) => number.to_string(),
                _ => return Err(format!("name the receiver at {at}")),
            };
            budgets.push((format!("receiver:{receiver}"), budget));
        }
        if let Some(budget) = self.spec.per_app {
            budgets.push((crate::APP.into(), budget));
        }
        let mut sent = body;
        let key: String = platform_key.chars().take(self.spec.key_max).collect();
        for pointer in &self.spec.key_at {
            set_at(&mut sent, pointer, Value::String(key.clone()))?;
        }
        for (pointer, value) in &self.spec.set {
            set_at(&mut sent, pointer, value.clone())?;
        }
        Ok((HttpMessage { body: sent }, budgets))
    }

    /// Posts `message`: the API's answer when it was sent, or why not.
    pub async fn send(&self, message: &HttpMessage) -> Result<Value, SendError> {
        let mut request = self.http.post(&self.spec.url).json(&message.body);
        for (name, value) in &self.spec.headers {
            request = request.header(name, value);
        }
        let answer = request.send().await.map_err(|error| {
            // Refused before it was taken: nothing went out.
            let connect = error.is_connect();
            let text = oncegate_core::redact::causes(&error.without_url());
            if connect {
                SendError::Transient(text)
            } else {
                SendError::Unknown(text)
            }
        })?;
        let status = answer.status();
        let after = answer
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = crate::feishu::read(answer)
            .await
            .map_err(SendError::Unknown)?;
        let document: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let said =
            || -> String { String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned() };
        let code = i64::from(status.as_u16());
        match status.as_u16() {
            200..=299 => {}
            429 => {
                return Err(SendError::RetryAfter {
                    after: after.unwrap_or(Duration::from_secs(1)),
                    code,
                    limit: crate::Limit::App,
                });
            }
            // A proxy's or the API's "not now": nothing was taken.
            502..=504 => return Err(SendError::Transient(format!("{status}: {}", said()))),
            // The API failed while handling it: it may have sent.
            500..=599 => return Err(SendError::Unknown(format!("{status}: {}", said()))),
            _ => {
                return Err(SendError::Permanent {
                    code,
                    message: said(),
                });
            }
        }
        let Some((at, ok)) = &self.spec.ok_at else {
            return Ok(document);
        };
        let result = document.pointer(at).cloned().unwrap_or(Value::Null);
        let same = |wanted: &Value| {
            wanted == &result || (wanted.as_i64().is_some() && wanted.as_i64() == result.as_i64())
        };
        if ok.iter().any(same) {
            Ok(document)
        } else if self.spec.retry_codes.iter().any(same) {
            Err(SendError::Transient(format!(
                "over a limit ({at} = {result}): {}",
                said()
            )))
        } else {
            Err(SendError::Permanent {
                code: result.as_i64().unwrap_or(code),
                message: said(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> HttpApiSpec {
        HttpApiSpec {
            url: "http://127.0.0.1:9/send".into(),
            headers: vec![("authorization".into(), "Bot secret".into())],
            key_at: vec!["/client_msg_id".into(), "/meta/nonce".into()],
            key_max: 25,
            set: vec![("/enforce_nonce".into(), Value::Bool(true))],
            dedups: true,
            ok_at: None,
            retry_codes: Vec::new(),
            receiver_at: Some("/channel_id".into()),
            per_receiver: Some(Budget::per_second(5)),
            per_app: Some(Budget::per_second(50)),
        }
    }

    #[test]
    fn the_key_and_fixed_fields_are_written_where_the_api_reads_them() {
        let api = HttpApi::new(spec(), "app", Duration::from_secs(1)).expect("api");
        let (message, budgets) = api
            .prepare(
                serde_json::json!({"channel_id": "C1", "content": "hi"}),
                &"k".repeat(32),
            )
            .expect("prepared");
        assert_eq!(
            message.body["client_msg_id"],
            "k".repeat(25),
            "cut to key_max"
        );
        assert_eq!(message.body["meta"]["nonce"], "k".repeat(25));
        assert_eq!(message.body["enforce_nonce"], true);
        assert_eq!(message.body["content"], "hi");
        assert_eq!(budgets[0].0, "receiver:C1");
        assert_eq!(budgets[1].0, crate::APP);
        assert!(api.repeat_safe());
        let refused = api
            .prepare(serde_json::json!({"content": "hi"}), "k")
            .expect_err("no receiver");
        assert!(refused.contains("/channel_id"), "{refused}");
        assert!(
            api.prepare(serde_json::json!(["not", "an", "object"]), "k")
                .is_err()
        );
        let secret = format!("{:?}", api);
        assert!(!secret.contains("Bot secret"), "{secret}");
    }

    #[test]
    fn specs_that_cannot_work_are_refused() {
        let mut bad = spec();
        bad.url = "ftp://x".into();
        assert!(HttpApi::new(bad, "a", Duration::from_secs(1)).is_err());
        let mut bad = spec();
        bad.key_at = vec!["client_msg_id".into()];
        assert!(HttpApi::new(bad, "a", Duration::from_secs(1)).is_err());
        let mut bad = spec();
        bad.key_max = 4;
        assert!(HttpApi::new(bad, "a", Duration::from_secs(1)).is_err());
    }
}
