//! What a `simulate` run reads of the gateway's counters: what it admitted, delivered and
//! dead-lettered meanwhile (from `/admin/live`, which reads no store), waiting until the
//! deliveries caught up, and the summary lines that say so.

use std::time::{Duration, Instant};

use anyhow::bail;

/// Fails when what the gateway admitted was not all delivered by the time nothing moved: a
/// sink that fails or is not there must not look like a success to a script.
pub(crate) fn undelivered(before: Option<Counts>, now: Option<Counts>) -> anyhow::Result<()> {
    if let (Some(before), Some(now)) = (before, now) {
        let (admitted, delivered, dead) = now.since(&before);
        if delivered < admitted {
            bail!(
                "{admitted} admitted but {delivered} delivered ({dead} dead-lettered, {} still \
                 waiting when nothing had moved for 10 s): the routes' sinks failed or are slow; \
                 see the gateway's log, `oncegate dlq list` and the status page",
                admitted.saturating_sub(delivered + dead)
            );
        }
    }
    Ok(())
}

/// The counters once the gateway admitted at least `expected` events since `before` (what a
/// long connection's demo pushed: it admits them after simulate is done pushing) and delivered
/// what it admitted — or once nothing moved for 10 s.
pub(crate) async fn settled(
    client: &reqwest::Client,
    admin: &str,
    token: Option<&str>,
    before: Option<Counts>,
    expected: u64,
) -> Option<Counts> {
    let mut now = counts(client, admin, token).await;
    let mut still = Instant::now();
    while let (Some(at), Some(before)) = (now, before) {
        // A dead letter is settled too: it will not be delivered.
        let (admitted, delivered, dead) = at.since(&before);
        let settled = delivered + dead;
        if (admitted >= expected && settled >= admitted)
            || still.elapsed() > Duration::from_secs(10)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = counts(client, admin, token).await;
        let progress = |c: Option<Counts>| {
            c.map(|c| c.admitted + c.spooled + c.delivered + c.stale_dropped + c.dead_letters)
        };
        if progress(again) != progress(now) {
            still = Instant::now();
        }
        now = again;
    }
    now
}

/// What the gateway admitted, dropped as duplicates and spooled during the run.
pub(crate) fn print_admitted(before: Option<Counts>, now: Option<Counts>) {
    if let (Some(before), Some(now)) = (before, now) {
        println!(
            "admitted           {}",
            now.admitted.saturating_sub(before.admitted)
        );
        println!(
            "duplicates dropped {}",
            now.duplicates.saturating_sub(before.duplicates)
        );
        if now.spooled > before.spooled {
            println!(
                "spooled            {} (the store was unreachable)",
                now.spooled.saturating_sub(before.spooled)
            );
        }
    }
}

/// What the gateway delivered during the run; when its counters could not be read, why.
/// The delivery rate from the first push to the last delivery, `elapsed` after the first.
pub(crate) fn print_end_to_end(before: Option<Counts>, now: Option<Counts>, elapsed: Duration) {
    if let (Some(before), Some(now)) = (before, now) {
        let delivered = now.delivered.saturating_sub(before.delivered);
        println!(
            "end to end         {:.0} events/s delivered (first push to last delivery, {:.2} s)",
            delivered as f64 / elapsed.as_secs_f64().max(0.001),
            elapsed.as_secs_f64()
        );
    }
}

pub(crate) async fn print_delivered(
    before: Option<Counts>,
    now: Option<Counts>,
    client: &reqwest::Client,
    admin: &str,
    token: Option<&str>,
) {
    match (before, now) {
        (Some(before), Some(now)) => {
            println!(
                "delivered          {}",
                now.delivered.saturating_sub(before.delivered)
            );
            let stale = now.stale_dropped.saturating_sub(before.stale_dropped);
            if stale > 0 {
                println!("dropped as stale   {stale}");
            }
            let dead = now.dead_letters.saturating_sub(before.dead_letters);
            if dead > 0 {
                println!("dead-lettered      {dead}");
            }
        }
        _ => println!(
            "admitted, delivered unknown ({})",
            counts_problem(client, admin, token).await
        ),
    }
}

/// Why the gateway's counters could not be read, said so that it can be fixed: a gateway that
/// is not there is not one that refused the token.
async fn counts_problem(client: &reqwest::Client, admin: &str, token: Option<&str>) -> String {
    let mut request = client.get(format!("{admin}/admin/live"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    match request.send().await {
        Err(error) => format!("admin API at {admin} not reachable: {error}"),
        Ok(answer) if answer.status() == reqwest::StatusCode::UNAUTHORIZED => format!(
            "admin API at {admin} refused the admin token: set ONCEGATE_ADMIN_TOKEN, or server.admin_token in --config"
        ),
        Ok(answer) if !answer.status().is_success() => {
            format!("admin API at {admin} answered {}", answer.status())
        }
        Ok(_) => format!("admin API at {admin} answered without the counters"),
    }
}

/// The gateway's counters that a run moves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counts {
    admitted: u64,
    duplicates: u64,
    spooled: u64,
    pub(crate) delivered: u64,
    stale_dropped: u64,
    pub(crate) replays_rejected: u64,
    dead_letters: u64,
}

impl Counts {
    /// Events admitted (spooled ones included), delivered (or dropped as stale) and
    /// dead-lettered since `before`.
    pub(crate) fn since(&self, before: &Counts) -> (u64, u64, u64) {
        (
            self.admitted.saturating_sub(before.admitted)
                + self.spooled.saturating_sub(before.spooled),
            self.delivered.saturating_sub(before.delivered)
                + self.stale_dropped.saturating_sub(before.stale_dropped),
            self.dead_letters.saturating_sub(before.dead_letters),
        )
    }
}

/// The gateway's counters from `/admin/live`, which reads no store: a run polls them while it
/// waits for its deliveries.
pub(crate) async fn counts(
    client: &reqwest::Client,
    admin: &str,
    token: Option<&str>,
) -> Option<Counts> {
    let mut request = client.get(format!("{admin}/admin/live"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let stats: serde_json::Value = request.send().await.ok()?.json().await.ok()?;
    let gateway = &stats["gateway"];
    let count = |name: &str| gateway[name].as_u64();
    Some(Counts {
        admitted: count("admitted")?,
        duplicates: count("duplicates")?,
        spooled: count("spooled")?,
        delivered: count("delivered")?,
        stale_dropped: count("stale_dropped")?,
        replays_rejected: count("replays_rejected").unwrap_or(0),
        dead_letters: count("dead_letters").unwrap_or(0),
    })
}
