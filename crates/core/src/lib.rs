//! The core of oncegate: normalized events, namespaced keys, the record state machine, the store
//! and queue traits every backend implements, and the pure protocol-layer guards.
//!
//! Nothing in this crate does I/O; backends live in sibling crates.

pub mod clock;
pub mod durability;
pub mod event;
pub mod key;
pub mod live_counts;
pub mod passthrough;
pub mod precedence;
pub mod queue_index;
pub mod rates;
pub mod record;
pub mod redact;
pub mod replay;
pub mod seqwindow;
pub mod shared_inlet;
pub mod source;
pub mod state;
pub mod store;
pub mod tenancy;
pub mod transition;
pub mod typed;

pub use clock::{Clock, ManualClock, SteadyClock, SystemClock};
pub use durability::Durability;
pub use event::Event;
pub use key::{DeliveryId, KeyHash, fingerprint_id, hex_into, key_for, sender_key};
pub use precedence::{FirstRule, Precedence};
pub use queue_index::{GroupLoad, Next, Place, Unranked};
pub use rates::{Rate, RateAdjust, RateVerdict};
pub use record::{
    Admission, Claim, DeadLetter, Delivery, FenceCheck, FencingToken, Fingerprint, Lease, Nonce,
    PartitionOwner, QueueId, QueueSummary, QueuedEvent, QueuedState, Record, RecordState,
    StoreStats, WatermarkOutcome,
};
pub use shared_inlet::SharedInlet;
pub use source::{
    Accepted, Admit, Callback, Decoded, Deliver, Headers, Inlet, Keys, Method, Owner, Refusal,
    RefusalKind, Replied, Reply, SealedRequest, Sealer, Sent, Stamp, SyntheticMembership,
    SyntheticMessage, TenancyChange, TenantSet, Tenants, Updates, Versions, WebhookSource,
};
pub use state::{Changed, Expect, StateStore, Versioned};
pub use store::{
    ClaimedDelivery, DedupStore, EventQueue, Loads, RateStore, Store, StoreError, WatermarkStore,
};
pub use typed::{FromEvent, ShapeError};
