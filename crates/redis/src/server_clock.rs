//! One clock for every gateway on a Redis: the server's `TIME`, followed by a [`SteadyClock`]
//! that runs on each machine's monotonic clock between reads. Leases, ownership, retries and
//! replay windows are then judged alike by every gateway, whatever their machines' wall clocks
//! say or do (a step of one machine's clock no longer makes a running lease look expired).

use std::time::{Duration, Instant};

use oncegate_core::{Clock, SteadyClock, StoreError};

use super::*;

/// How often the gateways read the server's clock again.
pub const CLOCK_SYNC_EVERY: Duration = Duration::from_secs(5);

impl<C: Clock> RedisStore<C> {
    /// The server's clock (`TIME`), unix ms.
    pub async fn server_time_ms(&self) -> Result<u64, StoreError> {
        self.run(|_inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let (seconds, micros): (u64, u64) = redis::cmd("TIME")
                .query_async(&mut conn)
                .await
                .map_err(from_redis)?;
            Ok(seconds.saturating_mul(1000) + micros / 1000)
        })
        .await
    }

    /// Reads the server's clock into `clock`, taking the middle of the round trip as the moment
    /// it was read.
    pub async fn sync_clock(&self, clock: &SteadyClock) -> Result<(), StoreError> {
        let sent = Instant::now();
        let server_ms = self.server_time_ms().await?;
        let round_trip = sent.elapsed();
        clock.sync(server_ms, sent + round_trip / 2);
        Ok(())
    }
}

impl<C: Clock> RedisStore<C> {
    /// Keeps `clock` on the server's time every [`CLOCK_SYNC_EVERY`] while the store lives (a
    /// read that fails leaves it running on the monotonic clock until the next one).
    pub fn follow_clock(&self, clock: SteadyClock) {
        let store = Arc::downgrade(&self.inner);
        self.handle.spawn(async move {
            loop {
                tokio::time::sleep(CLOCK_SYNC_EVERY).await;
                let Some(inner) = store.upgrade() else {
                    return;
                };
                let (mut conn, timeout) = (inner.conn.clone(), inner.timeout);
                drop(inner);
                let sent = Instant::now();
                let read = tokio::time::timeout(
                    timeout,
                    redis::cmd("TIME").query_async::<(u64, u64)>(&mut conn),
                )
                .await;
                if let Ok(Ok((seconds, micros))) = read {
                    let round_trip = sent.elapsed();
                    clock.sync(
                        seconds.saturating_mul(1000) + micros / 1000,
                        sent + round_trip / 2,
                    );
                }
            }
        });
    }
}
