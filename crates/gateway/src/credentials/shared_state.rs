//! The store's small shared values behind one object type, so that what keeps credentials
//! need not carry the store's type: every [`StateStore`] is one.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Changed, Expect, StateStore, StoreError, Versioned};

/// A boxed future of a shared-state call.
pub(crate) type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// [`StateStore`]'s get, put and remove, callable through `dyn`.
pub(crate) trait SharedState: Send + Sync {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> Call<'a, Option<Versioned>>;
    fn put<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        value: Bytes,
        expect: Expect,
        ttl: Option<Duration>,
    ) -> Call<'a, Changed>;
    fn remove<'a>(&'a self, namespace: &'a str, name: &'a str, expect: Expect)
    -> Call<'a, Changed>;
}

impl<S: StateStore> SharedState for S {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> Call<'a, Option<Versioned>> {
        Box::pin(self.state_get(namespace, name))
    }

    fn put<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        value: Bytes,
        expect: Expect,
        ttl: Option<Duration>,
    ) -> Call<'a, Changed> {
        Box::pin(self.state_put(namespace, name, value, expect, ttl))
    }

    fn remove<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        expect: Expect,
    ) -> Call<'a, Changed> {
        Box::pin(self.state_remove(namespace, name, expect))
    }
}
