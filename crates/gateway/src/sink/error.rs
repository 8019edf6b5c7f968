//! Why a delivery failed (and so what happens next), and why a sink could not be built.

/// Why a delivery failed, and so what happens next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Worth retrying later (timeouts, 408, 429, 5xx, refused connections).
    #[error("transient: {0}")]
    Transient(String),
    /// Will never succeed (other 4xx, a handler's verdict): dead-letter it.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The endpoint is gone (410, the Standard Webhooks rule): the route stops delivering
    /// until an operator resumes it.
    #[error("gone: {0}")]
    Gone(String),
    /// Worth retrying, but not before `after`: the downstream said so (`Retry-After` on a 429
    /// or 503). The dispatcher waits at least that long (up to `dispatcher.backoff_max`, or
    /// 10 minutes when that is shorter).
    #[error("transient: {reason}; retry after {after:?}")]
    RetryAfter {
        /// What the downstream answered.
        reason: String,
        /// How long it asked to wait.
        after: std::time::Duration,
    },
}

/// Why an HTTP sink could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SinkSetupError {
    /// The secret is not `whsec_` + base64.
    #[error("the webhook secret must be \"whsec_\" followed by base64")]
    Secret,
    /// The signing key is not `whsk_` + base64 of an Ed25519 key.
    #[error(
        "the signing key must be \"whsk_\" followed by the base64 of an Ed25519 key (its 32-byte seed, or seed and public key)"
    )]
    SigningKey,
    /// Previous secrets are set without a current one.
    #[error("previous_secrets need a current secret: set secret (the new one)")]
    PreviousWithoutSecret,
    /// The HTTP client failed to start.
    #[error("cannot start the HTTP client: {0}")]
    Client(String),
    /// The output file cannot be opened.
    #[error("cannot open {path}")]
    File {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}
