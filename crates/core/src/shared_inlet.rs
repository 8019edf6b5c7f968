//! An [`Inlet`] behind a pointer, whatever inlet it is: what a long-connection transport is
//! handed, so that a platform's transport crate knows no store and the gateway holds every
//! transport alike, behind one trait object.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::Rate;
use crate::event::Event;
use crate::source::{Accepted, Admit, Deliver, Inlet, Refusal, Replied, Updates};

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Inlet`] with its futures boxed: a trait objects can be made of. Every inlet is one.
trait ErasedInlet: Send + Sync + 'static {
    fn admit(&self, admit: Admit) -> Boxed<'_, Result<Accepted, Refusal>>;
    fn call(&self, admit: Admit, deadline: Duration) -> Boxed<'_, Result<Option<Bytes>, Refusal>>;
    fn replies(&self, event: &Event) -> bool;
    fn reply(
        &self,
        admit: Admit,
        deadline: Duration,
        budgets: Vec<(String, Rate)>,
        updates: Updates,
        deliver: Deliver,
    ) -> Boxed<'_, Result<Replied, Refusal>>;
    fn note(&self, label: &'static str, message: &str);
}

impl<I: Inlet> ErasedInlet for I {
    fn admit(&self, admit: Admit) -> Boxed<'_, Result<Accepted, Refusal>> {
        Box::pin(Inlet::admit(self, admit))
    }

    fn call(&self, admit: Admit, deadline: Duration) -> Boxed<'_, Result<Option<Bytes>, Refusal>> {
        Box::pin(Inlet::call(self, admit, deadline))
    }

    fn replies(&self, event: &Event) -> bool {
        Inlet::replies(self, event)
    }

    fn reply(
        &self,
        admit: Admit,
        deadline: Duration,
        budgets: Vec<(String, Rate)>,
        updates: Updates,
        deliver: Deliver,
    ) -> Boxed<'_, Result<Replied, Refusal>> {
        Box::pin(Inlet::reply(
            self, admit, deadline, budgets, updates, deliver,
        ))
    }

    fn note(&self, label: &'static str, message: &str) {
        Inlet::note(self, label, message);
    }
}

/// Any [`Inlet`], shared: cloning it shares the one inlet. It is an inlet itself, so a
/// transport generic over its inlet takes it as it takes any.
///
/// ```
/// use oncegate_core::{Accepted, Admit, Inlet, Refusal, SharedInlet};
///
/// struct Counting(std::sync::atomic::AtomicUsize);
///
/// impl Inlet for Counting {
///     async fn admit(&self, _: Admit) -> Result<Accepted, Refusal> {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         Ok(Accepted::Admitted)
///     }
///     async fn call(&self, _: Admit, _: std::time::Duration) -> Result<Option<bytes::Bytes>, Refusal> {
///         Ok(None)
///     }
///     fn note(&self, _: &'static str, _: &str) {}
/// }
///
/// let inlet = SharedInlet::new(Counting(Default::default()));
/// // A copy is the same inlet, and an inlet itself.
/// fn takes(_: impl Inlet) {}
/// takes(inlet.clone());
/// ```
#[derive(Clone)]
pub struct SharedInlet(Arc<dyn ErasedInlet>);

impl SharedInlet {
    /// Shares `inlet`.
    pub fn new(inlet: impl Inlet) -> Self {
        Self(Arc::new(inlet))
    }
}

impl std::fmt::Debug for SharedInlet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedInlet")
    }
}

impl Inlet for SharedInlet {
    fn admit(&self, admit: Admit) -> impl Future<Output = Result<Accepted, Refusal>> + Send {
        self.0.admit(admit)
    }

    fn call(
        &self,
        admit: Admit,
        deadline: Duration,
    ) -> impl Future<Output = Result<Option<Bytes>, Refusal>> + Send {
        self.0.call(admit, deadline)
    }

    fn replies(&self, event: &Event) -> bool {
        self.0.replies(event)
    }

    fn reply(
        &self,
        admit: Admit,
        deadline: Duration,
        budgets: Vec<(String, Rate)>,
        updates: Updates,
        deliver: Deliver,
    ) -> impl Future<Output = Result<Replied, Refusal>> + Send {
        self.0.reply(admit, deadline, budgets, updates, deliver)
    }

    fn note(&self, label: &'static str, message: &str) {
        self.0.note(label, message);
    }
}
