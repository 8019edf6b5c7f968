//! `oncegate queue`: a running gateway's queue, every partition at a glance or one in order.

use anyhow::bail;
use clap::Args;
use serde_json::Value;

use crate::remote::{Admin, Client, error_of, print_json};

/// `oncegate queue`.
#[derive(Debug, Args)]
pub(crate) struct QueueArgs {
    #[command(flatten)]
    admin: Admin,
    /// List this partition's events in queue order (every partition's summary without it).
    #[arg(long)]
    partition: Option<u16>,
    /// Start after this seq (the `next after` a previous listing printed).
    #[arg(long, requires = "partition")]
    after: Option<u64>,
    /// How many events (1 to 1000).
    #[arg(long, default_value_t = 100, requires = "partition")]
    limit: usize,
}

/// One line about the whole queue from `/admin/queue`'s summaries.
pub(crate) fn queue_line(answer: &Value) -> String {
    let partitions = answer["partitions"].as_array().cloned().unwrap_or_default();
    let n = |p: &Value, name: &str| p[name].as_u64().unwrap_or(0);
    let events: u64 = partitions.iter().map(|p| n(p, "events")).sum();
    let handed_out: u64 = partitions.iter().map(|p| n(p, "handed_out")).sum();
    let deepest = partitions.iter().max_by_key(|p| n(p, "events"));
    let oldest = partitions
        .iter()
        .filter_map(|p| p["oldest_age_seconds"].as_f64())
        .fold(0.0, f64::max);
    match deepest {
        Some(deepest) if events > 0 => format!(
            "queue        {events} events in {} partitions ({handed_out} handed out), deepest {} \
             with {}, oldest {oldest:.1} s old",
            partitions.len(),
            n(deepest, "partition"),
            n(deepest, "events"),
        ),
        _ => format!("queue        empty ({} partitions)", partitions.len()),
    }
}

/// One line about who owns the partitions, from `/admin/queue`'s `owners`; `None` for a store
/// of one gateway (it owns every partition).
pub(crate) fn owners_line(answer: &Value) -> Option<String> {
    let owners = answer.get("owners").filter(|o| !o.is_null())?;
    let gateways = owners["gateways"].as_object()?;
    let here = owners["this_gateway"].as_str();
    let n = |name: &str| owners[name].as_u64().unwrap_or(0);
    let shares: Vec<String> = gateways
        .iter()
        .map(|(name, count)| {
            let count = count.as_u64().unwrap_or(0);
            if Some(name.as_str()) == here {
                format!("{name} (this gateway) {count}")
            } else {
                format!("{name} {count}")
            }
        })
        .collect();
    let owners = match gateways.len() {
        1 => "1 gateway owns".to_owned(),
        count => format!("{count} gateways own"),
    };
    let mut line = format!("partitions   {owners} them: {}", shares.join(", "));
    if here.is_none() {
        line.push_str("; this gateway owns none");
    }
    if n("handing_over") > 0 {
        line.push_str(&format!("; handing {} over", n("handing_over")));
    }
    if n("unowned") > 0 {
        line.push_str(&format!("; {} unowned right now", n("unowned")));
    }
    Some(line)
}

fn state_text(state: &Value) -> String {
    match state["state"].as_str() {
        Some("delayed") => format!("delayed until {} ms", state["until_ms"]),
        Some(other) => other.replace('_', " "),
        None => "?".into(),
    }
}

pub(crate) async fn queue(args: QueueArgs) -> anyhow::Result<bool> {
    let client = Client::new(&args.admin)?;
    let (partition, after, limit) = (
        args.partition.map(|p| p.to_string()),
        args.after.map(|a| a.to_string()),
        args.limit.to_string(),
    );
    let mut query = Vec::new();
    if let Some(partition) = &partition {
        query.push(("partition", partition));
        query.push(("limit", &limit));
    }
    if let Some(after) = &after {
        query.push(("after", after));
    }
    let (status, answer) = client.get("/admin/queue", &query).await?;
    if status != 200 {
        bail!("/admin/queue: {status} {}", error_of(&answer));
    }
    if args.admin.json {
        print_json(&answer)?;
        return Ok(true);
    }
    if partition.is_none() {
        out!("{}", queue_line(&answer))?;
        if let Some(owners) = owners_line(&answer) {
            out!("{owners}")?;
        }
        for summary in answer["partitions"].as_array().into_iter().flatten() {
            let owner = &summary["owner"];
            let owned_by = match owner["gateway"].as_str() {
                _ if owner.is_null() => String::new(),
                Some(gateway) if owner["here"] == true => {
                    format!(", owner {gateway} (this gateway)")
                }
                Some(gateway) => format!(", owner {gateway}"),
                None => ", no owner right now".into(),
            };
            if summary["events"].as_u64().unwrap_or(0) > 0 || !owner.is_null() {
                out!(
                    "partition {:>3}  {} events, {} handed out, {} bytes, oldest {:.1} s old{owned_by}",
                    summary["partition"],
                    summary["events"],
                    summary["handed_out"],
                    summary["bytes"],
                    summary["oldest_age_seconds"].as_f64().unwrap_or(0.0),
                )?;
            }
        }
        return Ok(true);
    }
    let summary = &answer["summary"];
    out!(
        "partition {}: {} events, {} handed out, oldest {:.1} s old",
        summary["partition"],
        summary["events"],
        summary["handed_out"],
        summary["oldest_age_seconds"].as_f64().unwrap_or(0.0),
    )?;
    for event in answer["events"].as_array().into_iter().flatten() {
        out!(
            "{:<10} {} {} {} {} (attempt {}, {} bytes) {}",
            event["id"].as_str().unwrap_or(""),
            event["platform"].as_str().unwrap_or(""),
            event["app"].as_str().unwrap_or(""),
            event["event_type"].as_str().unwrap_or(""),
            event["event_id"].as_str().unwrap_or(""),
            event["attempt"],
            event["payload_bytes"],
            state_text(&event["state"]),
        )?;
    }
    if let Some(next) = answer["next_after"].as_u64() {
        out!("more: --after {next}")?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::owners_line;
    use serde_json::json;

    #[test]
    fn the_owners_line_counts_gateways_in_words() {
        let one = json!({"owners": {"gateways": {"gw-a": 16}, "this_gateway": "gw-a"}});
        assert_eq!(
            owners_line(&one).as_deref(),
            Some("partitions   1 gateway owns them: gw-a (this gateway) 16")
        );
        let two = json!({"owners": {"gateways": {"gw-a": 8, "gw-b": 8}, "this_gateway": "gw-b"}});
        let line = owners_line(&two).expect("a line");
        assert!(
            line.starts_with("partitions   2 gateways own them: "),
            "{line}"
        );
        assert_eq!(owners_line(&json!({"owners": null})), None);
    }
}
