//! WeCom (企业微信) and WeChat Official Account (公众号) callbacks for oncegate: the SHA-1
//! signatures, the AES scheme both share, their XML, and the dedup and order keys of every event
//! family. No store, no HTTP server: the gateway calls [`oncegate_core::WebhookSource`].
//!
//! One [`WecomApp`] is one corp (or suite) with its token and EncodingAESKey; one
//! [`WechatApp`] one Official Account, plain or safe mode. Each is configured as its own
//! source, so a gateway serves many of them, each at its own path, and their keys, order keys
//! and leases never meet (every key names the corp or app id).

mod aibot;
mod corps;
pub mod crypto;
pub mod events;
mod keys;
mod query;
mod signed;
mod source;
mod suite;
pub mod xml;

pub use aibot::AiBot;
pub use corps::{CorpApps, MAX_UNNAMED_VERIFICATION, WecomCorps};
pub use crypto::AesKey;
pub use source::owner;
pub use suite::{SUITE_EVENTS, SuiteTenants, WecomSuite};

/// Why a callback or a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum WecomError {
    /// The EncodingAESKey cannot be used.
    #[error("bad EncodingAESKey: {0}")]
    BadKey(String),
    /// A secret is empty.
    #[error("the {0} is empty: copy it from the platform's console")]
    EmptySecret(&'static str),
    /// The signature is missing or does not verify. Every failure before the signature checks
    /// out is this one error, so a forger learns nothing from the answer.
    #[error(
        "the signature does not verify: check the token (and EncodingAESKey) configured for this source"
    )]
    BadSignature,
    /// Signed, but the ciphertext does not decrypt.
    #[error("signed, but the ciphertext does not decrypt: {0}")]
    BadCiphertext(String),
    /// The ciphertext was made for another corp or app.
    #[error("the message was encrypted for {got:?}, not for this source's {expected:?}")]
    WrongReceiver {
        /// This source's receive id.
        expected: String,
        /// The message's.
        got: String,
    },
    /// The decrypted document is not XML (or JSON) this source reads.
    #[error("bad document: {0}")]
    BadDocument(String),
    /// The message is addressed to another corp or account.
    #[error("the message is for {got:?}, not for this source's {expected:?}")]
    WrongApp {
        /// This source's corp or app id.
        expected: String,
        /// The message's `ToUserName`.
        got: String,
    },
    /// The message is for another app (`AgentID`) of the corp.
    #[error("the message is for agent {got:?}, not for this source's {expected:?}")]
    WrongAgent {
        /// This source's agent.
        expected: String,
        /// The message's `AgentID`.
        got: String,
    },
    /// The timestamp parameter is not a number of seconds.
    #[error("the timestamp parameter {0:?} is not unix seconds")]
    BadTimestamp(String),
    /// A plain-mode request reached an Official Account configured for safe mode.
    #[error(
        "this Official Account is configured for safe mode (encoding_aes_key): a plain request is refused; set 安全模式 in the console"
    )]
    PlainRefused,
    /// A safe-mode request reached an Official Account configured without a key.
    #[error(
        "an encrypted request, but this source has no encoding_aes_key: add the key from the console"
    )]
    NoKey,
}

/// A WeCom corp (or third-party suite) receiving callbacks.
#[derive(Clone)]
pub struct WecomApp {
    corp_id: String,
    agent_id: Option<String>,
    token: String,
    key: AesKey,
}

impl std::fmt::Debug for WecomApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WecomApp")
            .field("corp_id", &self.corp_id)
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

impl WecomApp {
    /// The corp with its callback token and EncodingAESKey; neither may be empty.
    pub fn new(corp_id: &str, token: &str, encoding_aes_key: &str) -> Result<Self, WecomError> {
        if token.trim().is_empty() {
            return Err(WecomError::EmptySecret("token"));
        }
        Ok(Self {
            corp_id: corp_id.to_owned(),
            agent_id: None,
            token: token.to_owned(),
            key: AesKey::from_encoding_aes_key(encoding_aes_key)?,
        })
    }

    /// Only callbacks of the app `agent_id` (their `AgentID`) are taken.
    pub fn for_agent(mut self, agent_id: &str) -> Self {
        self.agent_id = Some(agent_id.to_owned());
        self
    }
}

/// A WeChat Official Account receiving callbacks: plain mode without a key, safe mode with one.
#[derive(Clone)]
pub struct WechatApp {
    app_id: String,
    /// The account's original id (`gh_…`): its messages' `ToUserName`, checked when known.
    original_id: Option<String>,
    token: String,
    key: Option<AesKey>,
}

impl std::fmt::Debug for WechatApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WechatApp")
            .field("app_id", &self.app_id)
            .field("safe_mode", &self.key.is_some())
            .finish_non_exhaustive()
    }
}

impl WechatApp {
    /// The account with its token, and its EncodingAESKey for safe mode.
    pub fn new(
        app_id: &str,
        token: &str,
        encoding_aes_key: Option<&str>,
    ) -> Result<Self, WecomError> {
        if token.trim().is_empty() {
            return Err(WecomError::EmptySecret("token"));
        }
        Ok(Self {
            app_id: app_id.to_owned(),
            original_id: None,
            token: token.to_owned(),
            key: encoding_aes_key
                .map(AesKey::from_encoding_aes_key)
                .transpose()?,
        })
    }
}

impl WechatApp {
    /// Checks that every message is addressed to the account's original id (`gh_…`, its
    /// `ToUserName`). Without it `ToUserName` is not checked: the receive id inside a safe-mode
    /// message's ciphertext is what binds it to the account.
    pub fn with_original_id(mut self, original_id: &str) -> Self {
        self.original_id = Some(original_id.to_owned());
        self
    }

    /// What a message to this account is addressed to, for the sealer.
    pub(crate) fn addressee(&self) -> &str {
        self.original_id.as_deref().unwrap_or(SIMULATED_ORIGINAL_ID)
    }
}

/// The original id simulated messages carry when the source names none.
pub const SIMULATED_ORIGINAL_ID: &str = "gh_0c0ffee0c0de";
