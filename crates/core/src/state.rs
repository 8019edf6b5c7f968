//! Shared state: small named values every gateway on a store reads and replaces — tenants,
//! tickets, permanent codes, tokens. Each lives under a name in a namespace, is replaced whole
//! with compare-and-set on its version, and may expire. A namespace's generation grows with
//! every change in it: a gateway polls that one number (O(1)) and reads the namespace again only
//! when it moved, which is how a change reaches every gateway within a poll.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::store::StoreError;

/// The longest namespace.
pub const MAX_NAMESPACE: usize = 64;
/// The longest name (an encrypted corp id, a suite id and an agent fit many times over).
pub const MAX_NAME: usize = 256;
/// The largest value: credentials and a tenant's settings, not payloads.
pub const MAX_VALUE: usize = 64 << 10;
/// The most values a [`StateStore::state_list`] call returns.
pub const MAX_LIST: usize = 1_000;

/// A value as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The namespace's generation when it was written: it grows with every change, so a
    /// newer value of a name always has a higher version.
    pub version: u64,
    /// The value.
    pub value: Bytes,
    /// When it expires, unix ms; `None`: never.
    pub expires_at_ms: Option<u64>,
}

/// How a conditional change went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    /// Done: the namespace's generation after it (a written value's version).
    Done(u64),
    /// Not done: the name's version is not the expected one; its current version (0: absent).
    Stale(u64),
}

/// What a change expects of the name's current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Whatever it holds, or nothing.
    Any,
    /// Nothing (absent or expired).
    Absent,
    /// The value of exactly this version.
    Version(u64),
}

impl Expect {
    /// Whether a name whose current version is `current` (0: absent) meets it.
    pub fn met_by(self, current: u64) -> bool {
        match self {
            Expect::Any => true,
            Expect::Absent => current == 0,
            Expect::Version(version) => version == current && current != 0,
        }
    }
}

/// Checks a call's namespace, name and value against the bounds every backend keeps.
pub fn check(namespace: &str, name: &str, value: Option<&[u8]>) -> Result<(), StoreError> {
    if namespace.is_empty() || namespace.len() > MAX_NAMESPACE {
        return Err(StoreError::Invalid(format!(
            "a state namespace is 1 to {MAX_NAMESPACE} bytes"
        )));
    }
    if namespace.contains(['{', '}']) {
        return Err(StoreError::Invalid(
            "a state namespace holds no braces (they are Redis Cluster hash tags)".into(),
        ));
    }
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(StoreError::Invalid(format!(
            "a state name is 1 to {MAX_NAME} bytes"
        )));
    }
    if let Some(value) = value
        && value.len() > MAX_VALUE
    {
        return Err(StoreError::Invalid(format!(
            "a state value is at most {MAX_VALUE} bytes ({} given)",
            value.len()
        )));
    }
    Ok(())
}

/// When a value written at `now_ms` for `ttl` expires.
pub fn expiry(now_ms: u64, ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|ttl| now_ms.saturating_add(crate::store::millis(ttl)).max(1))
}

/// Small shared values, by namespace and name (opaque, case-sensitive strings: a tenant id is
/// never normalised). Every change is atomic, and as durable as the store's admissions.
pub trait StateStore: Send + Sync + 'static {
    /// The value of `name`, unless absent or expired.
    fn state_get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Versioned>, StoreError>> + Send;

    /// Writes `value` under `name` if its current version meets `expect`, expiring after
    /// `ttl` (`None`: never).
    fn state_put(
        &self,
        namespace: &str,
        name: &str,
        value: Bytes,
        expect: Expect,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<Changed, StoreError>> + Send;

    /// Removes `name` if its current version meets `expect`; removing an absent name with
    /// [`Expect::Any`] is done, and changes nothing but the generation.
    fn state_remove(
        &self,
        namespace: &str,
        name: &str,
        expect: Expect,
    ) -> impl Future<Output = Result<Changed, StoreError>> + Send;

    /// Up to `limit` (at most [`MAX_LIST`]) live values of `namespace` whose names sort after
    /// `after`, in name order: a page of an explicit listing (its cost grows with the page,
    /// not with the namespace).
    fn state_list(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, Versioned)>, StoreError>> + Send;

    /// The namespace's generation: 0 before its first change, then higher after each one.
    fn state_generation(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_and_bounds() {
        assert!(Expect::Any.met_by(0) && Expect::Any.met_by(7));
        assert!(Expect::Absent.met_by(0) && !Expect::Absent.met_by(7));
        assert!(Expect::Version(7).met_by(7) && !Expect::Version(7).met_by(8));
        assert!(
            !Expect::Version(0).met_by(0),
            "version 0 names nothing stored"
        );
        assert!(check("tenants", "wwAbC", Some(b"{}")).is_ok());
        assert!(check("", "a", None).is_err());
        assert!(check("{x}", "a", None).is_err());
        assert!(check("tenants", "", None).is_err());
        assert!(check("tenants", &"n".repeat(MAX_NAME + 1), None).is_err());
        assert!(check("tenants", "a", Some(&vec![0; MAX_VALUE + 1])).is_err());
        assert_eq!(expiry(1_000, Some(Duration::from_secs(2))), Some(3_000));
        assert_eq!(expiry(1_000, None), None);
    }
}
