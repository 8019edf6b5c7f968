//! Acting once on the platforms: API clients that fetch one access token for all their callers,
//! carry the platform's own idempotency key (Feishu's `uuid`) derived from the caller's, and
//! class every failure by what a retry may do. Knows no store: the gateway adds the stored
//! results and the rate budgets.
//!
//! [`local`] is a Feishu-like API server for tests: it enforces tokens, rate limits and uuid
//! dedup, and counts what it really sent.

mod aibot;
mod api;
pub mod feishu;
pub mod feishu_store;
mod http_api;
/// A Feishu-like API server for tests.
pub mod local;
pub mod local_wecom;
mod token;
pub mod wecom;
pub mod wecom_suite;

use std::time::Duration;

pub use aibot::{AiBotApi, AiBotMessage};
pub use api::{APP, Api, Prepared};
pub use feishu::{FeishuApi, Message, RECEIVE_ID_TYPES};
pub use feishu_store::FeishuStoreApi;
pub use http_api::{HttpApi, HttpApiSpec, HttpMessage};
pub use oncegate_core::Rate as Budget;
pub use token::{TokenFuture, TokenSource};
pub use wecom::{WecomApi, WecomMessage};
pub use wecom_suite::{Authorisation, WecomSuiteApi};

/// The platforms' published limits, kept a little inside them.
pub mod limits {
    use std::time::Duration;

    use crate::Budget;

    /// Feishu: 5 messages per second to one receiver. Kept at 4.5 with a burst of 3 (Feishu
    /// allows 5): a send delayed between its grant and its arrival (a loaded machine, the
    /// network) then never tips Feishu's count over, because the slack grows with every send.
    pub const FEISHU_RECEIVER: Budget = Budget {
        count: 9,
        per: Duration::from_secs(2),
        burst: 3,
    };
    /// Feishu: one receiver's sends from one gateway start at least 1/5 s after the previous
    /// answer, so they arrive at most 5 in any second.
    pub const FEISHU_PACE: Duration = Duration::from_millis(200);
    /// Feishu: 50 calls per second per API and app.
    pub const FEISHU_APP: Budget = Budget::per_second(50);
    /// WeCom: 30 messages per minute to one member (beyond, WeCom drops them without a word).
    /// A bucket of `n` per minute with a burst of `b` lets `n + b - 1` through in some minute,
    /// so 24 with a burst of 5: 28 at most in any 60 s, two spare for arrival jitter.
    pub const WECOM_MEMBER: Budget = Budget::per_minute(24, 5);
    /// WeCom: 10 000 calls per minute per API and corp (9 699 at most in any minute: the
    /// slack covers a second of arrival jitter).
    pub const WECOM_APP: Budget = Budget::per_minute(9_500, 200);
    /// WeCom: and 150 000 per hour per API and corp (144 999 at most in any hour).
    pub const WECOM_APP_HOUR: Budget = per_hour(135_000, 10_000);
    /// WeCom: 1 000 messages per hour to one member (beyond, dropped without a word).
    pub const WECOM_MEMBER_HOUR: Budget = per_hour(950, 29);
    /// WeCom: a service provider's calls from one egress address, all its corps together:
    /// 40 000 per minute per API (38 999 at most in any minute) …
    pub const WECOM_ISV: Budget = Budget::per_minute(37_000, 2_000);
    /// … and 1 200 000 per hour (1 149 999 at most).
    pub const WECOM_ISV_HOUR: Budget = per_hour(1_100_000, 50_000);
    /// Feishu: sending messages is 1 000 per minute per app and tenant, besides 50 per second
    /// (949 at most in any minute).
    pub const FEISHU_APP_MINUTE: Budget = Budget::per_minute(900, 50);

    const fn per_hour(count: u32, burst: u32) -> Budget {
        Budget {
            count,
            per: Duration::from_secs(3600),
            burst,
        }
    }
}

/// Which limit a platform's rate answer speaks of, so that the budget it names is the one
/// lowered, and another tenant's or receiver's is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The receiver's (Feishu's 5 per second to a chat or user, an AI bot's conversation).
    Receiver,
    /// The app's in its tenant, per API (Feishu's app × tenant, WeCom's corp): the frequency
    /// window the platform blocks.
    App,
    /// Calls in flight at once (WeCom's 45033), not a rate.
    Concurrency,
}

/// Why a send did not go out (or may not have).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The platform refused it for good (a bad receiver, a card too old to edit): a retry
    /// gets the same answer, so none is made.
    #[error("refused by the platform (code {code}): {message}")]
    Permanent {
        /// The platform's error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// Over the platform's rate limit: wait this long, then send again with the same key.
    #[error("rate limited by the platform (code {code}); retry after {after:?}")]
    RetryAfter {
        /// How long the platform asked to wait.
        after: Duration,
        /// The platform's error code.
        code: i64,
        /// Which of the send's budgets the platform counted over.
        limit: Limit,
    },
    /// The request may have reached the platform (a timeout, a reset connection): the message
    /// may be out. Only a retry with the same key is safe.
    #[error("outcome unknown: {0}; retry with the same idempotency key, never a new one")]
    Unknown(String),
    /// It failed before the platform took it (no connection, the platform's server error):
    /// a retry with the same key is safe.
    #[error("not sent: {0}")]
    Transient(String),
    /// This gateway cannot send it now, another may (an AI bot's connection is held by another
    /// gateway, or being dialled): nothing was sent; try again after `after`, here or elsewhere.
    #[error("not sent: {reason}; retry after {after:?}")]
    NotHere {
        /// Why.
        reason: String,
        /// When a retry may find it possible.
        after: Duration,
    },
}

impl SendError {
    /// For a rate answer that does not say which of the platform's windows was passed, the
    /// longer block it may mean: WeCom's 45009 blocks 60 s for a minute's excess and 60 min
    /// for an hour's ("按分钟拦截则被屏蔽60秒，按小时拦截则被屏蔽60分钟"), and answers both alike.
    /// A caller that meets the same answer again right after the shorter pause takes this one.
    pub fn longer_pause(&self) -> Option<Duration> {
        match self {
            SendError::RetryAfter {
                code: wecom::FREQUENCY,
                limit: Limit::App,
                ..
            } => Some(Duration::from_secs(3600)),
            _ => None,
        }
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            SendError::Permanent { .. } => "permanent",
            SendError::RetryAfter { .. } => "rate_limited",
            SendError::Unknown(_) => "unknown_outcome",
            SendError::Transient(_) => "transient",
            SendError::NotHere { .. } => "not_here",
        }
    }
}

/// The platform's idempotency key for a caller's key: the same for every retry, restart and
/// gateway, at most 50 characters (Feishu's bound on `uuid`), and telling nothing of the key.
pub fn platform_key(namespace: &str, idempotency_key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{namespace}\n{idempotency_key}").as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_platform_key_is_stable_short_and_per_namespace() {
        let key = platform_key("shop", "order-42");
        assert_eq!(key, platform_key("shop", "order-42"));
        assert_eq!(key.len(), 32);
        assert_ne!(key, platform_key("other", "order-42"));
        assert_ne!(key, platform_key("shop", "order-43"));
    }
}
