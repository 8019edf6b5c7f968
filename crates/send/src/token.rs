//! An access token fetched once for every concurrent caller (single flight), kept until a few
//! minutes before it runs out, and fetched again once when the platform says it is invalid.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::SendError;

/// How long before its end a token is replaced: the SDKs' three minutes.
const REFRESH_AHEAD: Duration = Duration::from_secs(180);

#[derive(Clone)]
struct Held {
    value: String,
    until: Instant,
}

/// One app's token.
#[derive(Default)]
pub(crate) struct TokenCache {
    held: Mutex<Option<Held>>,
}

impl TokenCache {
    /// The current token, fetching one with `fetch` (value, lifetime) when there is none or
    /// it runs out soon. Callers that come while one fetches wait for that fetch.
    pub(crate) async fn get<F, E>(&self, fetch: F) -> Result<String, E>
    where
        F: AsyncFnOnce() -> Result<(String, Duration), E>,
    {
        let mut held = self.held.lock().await;
        if let Some(token) = held.as_ref()
            && Instant::now() + REFRESH_AHEAD < token.until
        {
            return Ok(token.value.clone());
        }
        let (value, lifetime) = fetch().await?;
        metrics::counter!("oncegate_send_token_refreshes_total").increment(1);
        *held = Some(Held {
            value: value.clone(),
            until: Instant::now() + lifetime,
        });
        Ok(value)
    }

    /// Forgets `value` if it is still the current token (the platform refused it): the next
    /// `get` fetches a new one, once, however many callers saw the refusal.
    pub(crate) async fn invalidate(&self, value: &str) {
        let mut held = self.held.lock().await;
        if held.as_ref().is_some_and(|token| token.value == value) {
            *held = None;
        }
    }
}

/// A future a [`TokenSource`] answers with.
pub type TokenFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where an app's access token comes from when it is not its own secret's: a WeCom suite's
/// corp token, a Feishu store app's tenant token — fetched with credentials the gateway keeps
/// and shared by every gateway. It is asked before every call and told when the platform
/// refused what it gave.
pub trait TokenSource: Send + Sync {
    /// The current token.
    fn token(&self) -> TokenFuture<'_, Result<String, SendError>>;
    /// The platform refused `token` (expired, revoked): the next `token` fetches another.
    fn refused<'a>(&'a self, token: &'a str) -> TokenFuture<'a, ()>;
}
