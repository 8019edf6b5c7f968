//! The claim protocol, written once: claim a key, run the work while renewing its lease, and
//! settle — complete with a result that repeats get, or release for a retry — exactly once,
//! on every path.
//!
//! This is what makes a side effect happen once in oncegate: its dispatcher, its card and
//! passive-reply calls, `/keys`, `/send` and its long connections' leader all go through it,
//! and a Rust program uses the same type around its own side effects, on any store (in
//! memory, the embedded journal, Redis — shared by every instance).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use oncegate_core::KeyHash;
//! use oncegate_memory::MemoryStore;
//! use oncegate_once::{Once, OnceKey, Outcome};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let once = Once::new(Arc::new(MemoryStore::new()));
//! let order = OnceKey::new(KeyHash::of(&["shop", "order", "42"]), 0);
//! let mut charged = 0;
//! for _ in 0..3 {
//!     let outcome = once
//!         .run(order, Duration::from_secs(5), |_lease| async {
//!             charged += 1; // the side effect
//!             Ok::<_, std::io::Error>(Some("receipt-7".into()))
//!         })
//!         .await
//!         .expect("the store answers");
//!     match outcome {
//!         Outcome::Ran(receipt) | Outcome::Done(receipt) => {
//!             assert_eq!(receipt.as_deref(), Some(&b"receipt-7"[..]))
//!         }
//!         other => panic!("{other:?}"),
//!     }
//! }
//! assert_eq!(charged, 1);
//! # });
//! ```
//!
//! For work that settles itself (an answer that goes out before it is recorded, a lease
//! handed to a client), [`Once::claim`] gives a [`Held`] guard: it renews while
//! [`Held::run`] runs, settles once, and releases its key if dropped unsettled.

mod held;
mod key;
mod observe;
mod once;

pub use held::{Held, LeaseEnded, Panicked};
pub use key::OnceKey;
pub use observe::{Observer, Quiet, Renewal};
pub use once::{Claimed, Once, Outcome, RunError};
