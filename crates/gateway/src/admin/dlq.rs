//! Dead letters for operators: listed with filters, replayed (back into their queue once,
//! keeping their key) or purged.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use oncegate_core::{DeadLetter, QueueId, Store};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Shared;
use crate::admin::auth::{authorized, authorized_query};
use crate::refusal::refused;
use oncegate_core::RefusalKind;

/// Dead letters read per request: filters apply to this many, oldest first.
pub(crate) const SCAN: usize = 100_000;
/// The most ids one replay or purge may name.
const MAX_IDS: usize = 10_000;

/// Which dead letters a request means: for a replay or purge, the named `ids`, or every letter
/// the filters match when `all` is true. Unknown fields are refused: a misspelt filter must not
/// widen a replay to every letter.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ask {
    /// The most to list.
    limit: Option<usize>,
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    all: bool,
    /// The platform (`feishu`, `wecom`, …).
    platform: Option<String>,
    /// The app on it.
    app: Option<String>,
    /// The event type, exactly.
    event_type: Option<String>,
    /// Part of the reason it died.
    reason: Option<String>,
    /// Its event id.
    event_id: Option<String>,
    /// Dead-lettered at or after this (unix ms).
    since_ms: Option<u64>,
    /// Dead-lettered before this (unix ms).
    until_ms: Option<u64>,
}

impl Ask {
    fn matches(&self, letter: &DeadLetter) -> bool {
        let event = &letter.event;
        self.platform
            .as_deref()
            .is_none_or(|p| *event.platform == *p)
            && self.app.as_deref().is_none_or(|a| *event.app == *a)
            && self
                .event_type
                .as_deref()
                .is_none_or(|t| *event.event_type == *t)
            && self
                .reason
                .as_deref()
                .is_none_or(|r| letter.reason.contains(r))
            && self
                .event_id
                .as_deref()
                .is_none_or(|e| &*event.event_id == e)
            && self.since_ms.is_none_or(|since| letter.at_ms >= since)
            && self.until_ms.is_none_or(|until| letter.at_ms < until)
    }
}

/// `partition:seq`, the id operators see.
pub(crate) fn id_text(id: QueueId) -> String {
    format!("{}:{}", id.partition, id.seq)
}

fn parse_id(text: &str) -> Option<QueueId> {
    let (partition, seq) = text.split_once(':')?;
    Some(QueueId {
        partition: partition.parse().ok()?,
        seq: seq.parse().ok()?,
    })
}

pub(crate) fn letter_json(letter: &DeadLetter) -> Value {
    json!({
        "id": id_text(letter.id),
        "key": letter.key.to_string(),
        "platform": &*letter.event.platform,
        "app": &*letter.event.app,
        "event_id": letter.event.event_id,
        "event_type": &*letter.event.event_type,
        "order_key": letter.event.order_key,
        "attempts": letter.attempts,
        "reason": letter.reason,
        "at_ms": letter.at_ms,
    })
}

fn unavailable(error: impl std::fmt::Display) -> Response {
    refused(
        RefusalKind::Unavailable,
        "unavailable",
        format!("the store cannot answer: {error}; retry"),
    )
}

pub(crate) async fn list<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let usage = "filters: platform, app, event_type, reason, event_id; limit";
    let query: Ask = match authorized_query(&shared, &headers, &uri, usage) {
        Ok(query) => query,
        Err(refusal) => return refusal,
    };
    let limit = query.limit.unwrap_or(100).clamp(1, SCAN);
    match shared.store.dead_letters(SCAN).await {
        Ok(letters) => {
            let total = letters.len();
            let matched: Vec<_> = letters.iter().filter(|l| query.matches(l)).collect();
            let shown: Vec<Value> = matched
                .iter()
                .take(limit)
                .map(|letter| letter_json(letter))
                .collect();
            // The store's own count (cheap): what a listing of `scanned` may leave out.
            let kept = shared.store.dead_letter_count().await.ok();
            axum::Json(json!({
                "dead_letters": shown,
                "matching": matched.len(),
                "scanned": total,
                "kept": kept,
            }))
            .into_response()
        }
        Err(error) => unavailable(error),
    }
}

/// The ids an authorized caller's selection names, or why it names none.
#[allow(clippy::result_large_err)]
async fn selected<S: Store>(
    shared: &Shared<S>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Vec<QueueId>, Response> {
    authorized(shared, headers)?;
    let selection: Ask = serde_json::from_slice(body).map_err(|error| {
        refused(
            RefusalKind::BadInput,
            "bad_request",
            format!(
                "{error}; send {{\"ids\": [\"partition:seq\", …]}} or {{\"all\": true, …filters}}"
            ),
        )
    })?;
    if selection.ids.len() > MAX_IDS {
        return Err(refused(
            RefusalKind::BadInput,
            "bad_request",
            format!("at most {MAX_IDS} ids at once"),
        ));
    }
    match (selection.ids.is_empty(), selection.all) {
        (false, false) => selection
            .ids
            .iter()
            .map(|text| {
                let partitions = shared.store.partitions();
                match parse_id(text) {
                    Some(id) if id.partition < partitions => Ok(id),
                    Some(_) => Err(refused(RefusalKind::BadInput, "bad_request",
                        format!(
                            "{text:?} names a partition the store does not have (it has partitions 0 to {})",
                            partitions.saturating_sub(1)
                        ),
                    )),
                    None => Err(refused(RefusalKind::BadInput, "bad_request",
                        format!("{text:?} is not a dead letter id (partition:seq)"),
                    )),
                }
            })
            .collect(),
        (true, true) => match shared.store.dead_letters(SCAN).await {
            Ok(letters) => Ok(letters
                .iter()
                .filter(|l| selection.matches(l))
                .map(|l| l.id)
                .collect()),
            Err(error) => Err(unavailable(error)),
        },
        _ => Err(refused(RefusalKind::BadInput, "bad_request",
            "name the dead letters: \"ids\", or \"all\": true (with filters to narrow it), not both",
        )),
    }
}

/// What an operator does to dead letters.
#[derive(Clone, Copy)]
enum Action {
    Replay,
    Purge,
}

pub(crate) async fn replay<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    apply(&shared, &headers, &body, Action::Replay).await
}

pub(crate) async fn purge<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    apply(&shared, &headers, &body, Action::Purge).await
}

/// Applies `action` to each selected dead letter in turn: what it did and which ids were no
/// dead letter. A store failure midway answers 503 with what was done before it: those are
/// gone from the dead letters, so a retry of the same request never applies them twice.
async fn apply<S: Store>(
    shared: &Shared<S>,
    headers: &HeaderMap,
    body: &Bytes,
    action: Action,
) -> Response {
    let ids = match selected(shared, headers, body).await {
        Ok(ids) => ids,
        Err(refusal) => return refusal,
    };
    let done = match action {
        Action::Replay => "replayed",
        Action::Purge => "purged",
    };
    let (mut applied, mut missing) = (Vec::new(), Vec::new());
    for id in ids {
        let outcome = match action {
            Action::Replay => shared.store.replay_dead_letter(id).await.map(|queued| {
                queued.map(|queued| {
                    tracing::info!(dead_letter = %id_text(id), queued = %id_text(queued), "dead letter replayed");
                    json!({"id": id_text(id), "queued": id_text(queued)})
                })
            }),
            Action::Purge => shared.store.purge_dead_letter(id).await.map(|purged| {
                purged.then(|| {
                    tracing::info!(dead_letter = %id_text(id), "dead letter purged");
                    json!(id_text(id))
                })
            }),
        };
        match outcome {
            Ok(Some(answer)) => {
                metrics::counter!(format!("oncegate_dead_letters_{done}_total")).increment(1);
                applied.push(answer);
            }
            Ok(None) => missing.push(id_text(id)),
            Err(error) => {
                let body = json!({
                    done: applied,
                    "missing": missing,
                    "error": format!("the store cannot answer: {error}; retry (what is listed was done)"),
                });
                return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            }
        }
    }
    axum::Json(json!({done: applied, "missing": missing})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_back_and_bad_ones_are_refused() {
        let id = QueueId {
            partition: 7,
            seq: 123_456,
        };
        assert_eq!(parse_id(&id_text(id)), Some(id));
        for bad in [
            "", "7", "7:", ":5", "x:5", "7:y", "70000:1", "1:2:3", "-1:2",
        ] {
            assert_eq!(parse_id(bad), None, "{bad:?}");
        }
    }
}
