//! DingTalk (钉钉) for oncegate: the HTTP event subscription (事件订阅, "HTTP推送"). A callback
//! is `POST ?msg_signature|signature=…&timeStamp|timestamp=…&nonce=…` with `{"encrypt": …}`:
//! SHA-1 over the sorted token, timestamp, nonce and ciphertext; AES-256-CBC with the receive
//! id (the app key, a corp id, or a suite key) checked; answered with the encrypted `success`
//! map within 1 500 ms (facts and vectors: `shared/protocols/sources.md` §1a). The URL check
//! (`check_url`) is answered the same way and admits nothing. Stream mode's frames and acks:
//! [`stream`].
//!
//! ```
//! use oncegate_dingtalk::DingtalkApp;
//!
//! let app = DingtalkApp::new("mryue", "Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7", "ding6ccabc44d2c8d38b")
//!     .expect("a 43-character key");
//! assert_eq!(oncegate_core::WebhookSource::platform(&app), "dingtalk");
//! ```

mod source;
pub mod stream;

pub use source::DingtalkApp;

/// Why a DingTalk app cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum DingtalkError {
    /// The AES key is not DingTalk's 43 characters of base64.
    #[error("bad aes_key: {0}")]
    Key(String),
    /// A setting is empty.
    #[error("{0} is empty: DingTalk checks every callback with it")]
    Empty(&'static str),
}
