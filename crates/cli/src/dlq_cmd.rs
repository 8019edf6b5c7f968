//! `oncegate dlq`: a running gateway's dead letters — list them, replay them (once, keeping
//! their keys) or purge them.

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::remote::{Admin, Client, error_of, print_json};

/// Which dead letters: filters narrow `list` and an `--all` replay or purge.
#[derive(Debug, Args)]
pub(crate) struct Filters {
    /// The platform: feishu, lark, wecom, wechat.
    #[arg(long)]
    platform: Option<String>,
    /// The app on it.
    #[arg(long)]
    app: Option<String>,
    /// The event type, exactly.
    #[arg(long)]
    event_type: Option<String>,
    /// Part of the reason it died.
    #[arg(long)]
    reason: Option<String>,
    /// Its event id.
    #[arg(long)]
    event_id: Option<String>,
    /// Only letters that died within this long before now (`2h`, `30m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    since: Option<std::time::Duration>,
    /// Only letters that died longer than this before now.
    #[arg(long, value_parser = humantime::parse_duration)]
    until: Option<std::time::Duration>,
}

impl Filters {
    fn fields(&self) -> Vec<(&'static str, Value)> {
        let now_ms = oncegate_core::Clock::now_ms(&oncegate_core::SystemClock);
        let ago = |span: &Option<std::time::Duration>| {
            span.map(|span| json!(now_ms.saturating_sub(span.as_millis() as u64)))
        };
        let text = |value: &Option<String>| value.as_ref().map(|v| json!(v));
        [
            ("platform", text(&self.platform)),
            ("app", text(&self.app)),
            ("event_type", text(&self.event_type)),
            ("reason", text(&self.reason)),
            ("event_id", text(&self.event_id)),
            ("since_ms", ago(&self.since)),
            ("until_ms", ago(&self.until)),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name, v)))
        .collect()
    }
}

/// `oncegate dlq …`.
#[derive(Debug, Args)]
pub(crate) struct DlqArgs {
    #[command(flatten)]
    admin: Admin,
    #[command(subcommand)]
    what: Dlq,
}

#[derive(Debug, Subcommand)]
enum Dlq {
    /// Dead letters, oldest first.
    List {
        #[command(flatten)]
        filters: Filters,
        /// How many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Put dead letters back into their queue, once each, keeping their keys.
    Replay(Selection),
    /// Remove dead letters for good.
    Purge(Selection),
}

#[derive(Debug, Args)]
struct Selection {
    /// A dead letter's id (partition:seq, as `list` shows); repeat for several.
    #[arg(long = "id", required_unless_present = "all", conflicts_with = "all")]
    ids: Vec<String>,
    /// Every dead letter the filters match (all of them without filters).
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    filters: Filters,
}

pub(crate) async fn dlq(args: DlqArgs) -> anyhow::Result<bool> {
    let client = Client::new(&args.admin)?;
    match args.what {
        Dlq::List { filters, limit } => {
            let mut fields = filters.fields();
            fields.push(("limit", json!(limit)));
            // As query text: strings bare, numbers as written.
            let query: Vec<(&str, String)> = fields
                .into_iter()
                .map(|(name, value)| match value {
                    Value::String(text) => (name, text),
                    other => (name, other.to_string()),
                })
                .collect();
            let query: Vec<(&str, &String)> =
                query.iter().map(|(name, value)| (*name, value)).collect();
            let (status, answer) = client.get("/admin/dead-letters", &query).await?;
            if status != 200 {
                bail!("/admin/dead-letters: {status} {}", error_of(&answer));
            }
            if args.admin.json {
                print_json(&answer)?;
                return Ok(true);
            }
            let letters = answer["dead_letters"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            out!(
                "{:<12} {:<28} {:<24} {:>8}  reason",
                "id",
                "event type",
                "event id",
                "attempts"
            )?;
            for letter in &letters {
                out!(
                    "{:<12} {:<28} {:<24} {:>8}  {}",
                    letter["id"].as_str().unwrap_or(""),
                    letter["event_type"].as_str().unwrap_or(""),
                    letter["event_id"].as_str().unwrap_or(""),
                    letter["attempts"],
                    letter["reason"].as_str().unwrap_or(""),
                )?;
            }
            let matching = answer["matching"].as_u64().unwrap_or(letters.len() as u64);
            let plural = |n: u64| if n == 1 { "" } else { "s" };
            if matching > letters.len() as u64 {
                out!(
                    "{} of {matching} dead letter{} shown, oldest first; the rest with --limit {matching}",
                    letters.len(),
                    plural(matching)
                )?;
            } else {
                out!(
                    "{} dead letter{}",
                    letters.len(),
                    plural(letters.len() as u64)
                )?;
            }
            Ok(true)
        }
        Dlq::Replay(selection) => {
            let answer = client
                .post("/admin/dead-letters/replay", &body(&selection))
                .await?;
            report(&answer, "replayed", args.admin.json)
        }
        Dlq::Purge(selection) => {
            let answer = client
                .post("/admin/dead-letters/purge", &body(&selection))
                .await?;
            report(&answer, "purged", args.admin.json)
        }
    }
}

fn body(selection: &Selection) -> Value {
    let mut body = json!({});
    if selection.all {
        body["all"] = json!(true);
        for (name, value) in selection.filters.fields() {
            body[name] = value;
        }
    } else {
        body["ids"] = json!(selection.ids);
    }
    body
}

/// Prints what a replay or purge did; `false` when some named letter was not there.
fn report(answer: &Value, done: &str, json: bool) -> anyhow::Result<bool> {
    let missing = answer["missing"].as_array().cloned().unwrap_or_default();
    if json {
        print_json(answer)?;
        return Ok(missing.is_empty());
    }
    let count = answer[done].as_array().map_or(0, Vec::len);
    out!("{done} {count}")?;
    for id in &missing {
        out!(
            "not a dead letter (replayed or purged already?): {}",
            id.as_str().unwrap_or("")
        )?;
    }
    Ok(missing.is_empty())
}
