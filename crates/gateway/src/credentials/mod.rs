//! Credentials that are state, not configuration: a WeCom suite's ticket-born suite token, each
//! corp's permanent code and token. They live in the store, shared by every gateway on it, and
//! change while the gateway runs (a corp authorises, a token expires).

pub(crate) mod shared_state;
pub(crate) mod suite;
pub(crate) mod tokens;

pub(crate) use suite::SuiteKeeper;
