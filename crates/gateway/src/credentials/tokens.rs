//! Access tokens shared by every gateway on one store: kept under their name in a namespace
//! until a few minutes before they run out, fetched by one caller at a time — one in this
//! gateway (a lock per name) and one among all gateways (a short lease in the store) — and
//! dropped at once when the platform refuses them. A token cache keyed by app alone is the bug
//! three official SDKs shipped (`shared/protocols/tenants.md` §2.4): each name here is one
//! (app, tenant).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncegate_core::{Changed, Expect, StoreError};
use oncegate_send::SendError;

use super::shared_state::SharedState;

/// How long before its end a token is replaced: the SDKs' three minutes.
const REFRESH_AHEAD: Duration = Duration::from_secs(180);
/// How long one gateway may hold the right to fetch a name's token: longer than a call's
/// deadline, so that a gateway that died fetching delays the others this long at most.
const LEASE: Duration = Duration::from_secs(15);
/// How often a gateway waiting for another's fetch looks again.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// Tokens of one namespace.
pub(crate) struct SharedTokens {
    store: Arc<dyn SharedState>,
    namespace: String,
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn unavailable(error: StoreError) -> SendError {
    SendError::Transient(format!("the store cannot answer: {error}"))
}

fn lease(name: &str) -> String {
    format!("fetching:{name}")
}

impl SharedTokens {
    /// The tokens of `namespace` in `store`.
    pub(crate) fn new(store: Arc<dyn SharedState>, namespace: String) -> Self {
        Self {
            store,
            namespace,
            flights: Mutex::default(),
        }
    }

    fn flight(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.flights
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    async fn current(&self, name: &str) -> Result<Option<String>, SendError> {
        let kept = self
            .store
            .get(&self.namespace, name)
            .await
            .map_err(unavailable)?;
        Ok(kept.and_then(|kept| String::from_utf8(kept.value.to_vec()).ok()))
    }

    /// The token `name`: the one kept, or one fetched by `fetch` (value, lifetime) when none
    /// is — by this caller only if no other caller, here or on another gateway, is fetching
    /// it; the others wait for that fetch.
    pub(crate) async fn get<F>(&self, name: &str, fetch: F) -> Result<String, SendError>
    where
        F: AsyncFnOnce() -> Result<(String, Duration), SendError>,
    {
        let flight = self.flight(name);
        let _one_here = flight.lock().await;
        let gave_up = Instant::now() + LEASE + LEASE;
        loop {
            if let Some(token) = self.current(name).await? {
                return Ok(token);
            }
            let taken = self
                .store
                .put(
                    &self.namespace,
                    &lease(name),
                    Bytes::new(),
                    Expect::Absent,
                    Some(LEASE),
                )
                .await
                .map_err(unavailable)?;
            if let Changed::Done(_) = taken {
                // A fetch that ended between the look above and the lease kept its token and
                // let the lease go: that token, not a second fetch.
                match self.current(name).await {
                    Ok(None) => break,
                    kept => {
                        let _ = self
                            .store
                            .remove(&self.namespace, &lease(name), Expect::Any)
                            .await;
                        if let Some(token) = kept? {
                            return Ok(token);
                        }
                    }
                }
            }
            if Instant::now() > gave_up {
                return Err(SendError::Transient(format!(
                    "another gateway has been fetching the token {name:?} for {LEASE:?} or more"
                )));
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
        let fetched = fetch().await;
        let kept = match &fetched {
            Ok((value, lifetime)) => {
                metrics::counter!("oncegate_send_token_refreshes_total").increment(1);
                let keep = lifetime.saturating_sub(REFRESH_AHEAD);
                if keep.is_zero() {
                    Ok(())
                } else {
                    self.store
                        .put(
                            &self.namespace,
                            name,
                            Bytes::from(value.clone()),
                            Expect::Any,
                            Some(keep),
                        )
                        .await
                        .map(|_| ())
                }
            }
            Err(_) => Ok(()),
        };
        let released = self
            .store
            .remove(&self.namespace, &lease(name), Expect::Any)
            .await;
        kept.and(released.map(|_| ())).map_err(unavailable)?;
        fetched.map(|(value, _)| value)
    }

    /// The platform refused `token`: forgotten if it is still the one kept, so that the next
    /// `get` fetches a new one — once, however many callers saw the refusal.
    pub(crate) async fn refused(&self, name: &str, token: &str) {
        let Ok(Some(kept)) = self.store.get(&self.namespace, name).await else {
            return;
        };
        if kept.value == token.as_bytes() {
            let _ = self
                .store
                .remove(&self.namespace, name, Expect::Version(kept.version))
                .await;
        }
    }

    /// Forgets the token `name` (its tenant left).
    pub(crate) async fn forget(&self, name: &str) -> Result<(), StoreError> {
        self.store
            .remove(&self.namespace, name, Expect::Any)
            .await
            .map(|_| ())
    }
}

/// A keeper of tenants' tokens: what fetches one tenant's token, and the tokens it keeps.
pub(crate) trait TenantTokenKeeper: Send + Sync + 'static {
    /// Tenant `tenant`'s token, kept or fetched.
    fn tenant_token<'a>(
        &'a self,
        tenant: &'a str,
    ) -> oncegate_send::TokenFuture<'a, Result<String, SendError>>;
    /// The tokens it keeps.
    fn tokens(&self) -> &SharedTokens;
    /// The name of tenant `tenant`'s token among them.
    fn token_name(&self, tenant: &str) -> String;
}

/// One tenant's token, for its sender — which its keeper holds: hence weak.
pub(crate) struct TenantToken<K> {
    pub(crate) keeper: std::sync::Weak<K>,
    pub(crate) tenant: String,
}

impl<K: TenantTokenKeeper> oncegate_send::TokenSource for TenantToken<K> {
    fn token(&self) -> oncegate_send::TokenFuture<'_, Result<String, SendError>> {
        Box::pin(async move {
            match self.keeper.upgrade() {
                Some(keeper) => keeper.tenant_token(&self.tenant).await,
                None => Err(SendError::Transient("the gateway is closing".into())),
            }
        })
    }

    fn refused<'a>(&'a self, token: &'a str) -> oncegate_send::TokenFuture<'a, ()> {
        Box::pin(async move {
            if let Some(keeper) = self.keeper.upgrade() {
                let name = keeper.token_name(&self.tenant);
                keeper.tokens().refused(&name, token).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::credentials::shared_state::Call;

    /// A gateway whose store answers its lease requests late: it asks for the lease after
    /// another gateway's fetch looked, fetched, kept the token and let the lease go.
    struct LateLeases(Arc<dyn SharedState>);

    impl SharedState for LateLeases {
        fn get<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> Call<'a, Option<oncegate_core::Versioned>> {
            self.0.get(namespace, name)
        }

        fn put<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
            value: Bytes,
            expect: Expect,
            ttl: Option<Duration>,
        ) -> Call<'a, Changed> {
            Box::pin(async move {
                if name.starts_with("fetching:") {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
                self.0.put(namespace, name, value, expect, ttl).await
            })
        }

        fn remove<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
            expect: Expect,
        ) -> Call<'a, Changed> {
            self.0.remove(namespace, name, expect)
        }
    }

    /// Two gateways on one store ask for a token none keeps: one fetch, whichever asked late
    /// — before, the late one took the lease the first had let go, and fetched again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_taken_after_anothers_fetch_takes_that_token_not_a_second() {
        let store: Arc<dyn SharedState> = Arc::new(oncegate_memory::MemoryStore::new());
        let first = SharedTokens::new(store.clone(), "tokens:t".into());
        let late = SharedTokens::new(Arc::new(LateLeases(store)), "tokens:t".into());
        let fetches = AtomicUsize::new(0);
        let fetch = async || {
            let n = fetches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok((format!("token-{n}"), Duration::from_secs(7200)))
        };
        let (a, b) = tokio::join!(first.get("app", fetch), async {
            // Looks while the first fetches, and asks for the lease after it is let go.
            tokio::time::sleep(Duration::from_millis(2)).await;
            late.get("app", fetch).await
        });
        assert_eq!(fetches.load(Ordering::SeqCst), 1, "one fetch for both");
        assert_eq!(
            (a.expect("first"), b.expect("late")),
            ("token-0".into(), "token-0".into())
        );
    }
}
