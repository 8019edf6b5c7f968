//! What every wing shares: the counters and metrics, the measured store, the log's summaries,
//! and the delivery history.

pub(crate) mod at_rest;
pub(crate) mod attempts;
pub(crate) mod meters;
pub(crate) mod recorder;
pub mod stats;
pub(crate) mod summary;
pub(crate) mod tenant_names;
pub(crate) mod timed_store;
pub(crate) mod traces;
