//! Which answers wait for the journal: with a journal whose syncs hang, the answers that must be
//! durable (an admit, `complete`, an ack) wait, and those that need not (a claim, the
//! dispatcher's complete-and-ack) come back at once.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use oncegate_contract::{START_MS, block_on, event, key};
use oncegate_core::{Admission, Claim, DedupStore, EventQueue, FenceCheck, ManualClock};
use oncegate_memory::{Change, Journal, MemoryConfig, MemoryStore};

/// A journal that counts every change and makes nothing durable until `durable` is set.
#[derive(Default)]
struct Held {
    durable: AtomicBool,
    appended: AtomicUsize,
}

#[derive(Clone, Default)]
struct HeldJournal(Arc<Held>);

impl Journal for HeldJournal {
    fn check(&self) -> Result<(), oncegate_core::StoreError> {
        Ok(())
    }

    fn append(&self, _: &Change<'_>) {
        self.0.appended.fetch_add(1, Ordering::SeqCst);
    }

    fn sync(&self) -> impl Future<Output = Result<(), oncegate_core::StoreError>> + Send {
        let journal = self.clone();
        std::future::poll_fn(move |_| {
            if journal.0.durable.load(Ordering::SeqCst) {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        })
    }
}

/// Polls `future` once: its answer, if it has one without waiting.
fn at_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

#[test]
fn durable_answers_wait_for_the_sync_and_the_dispatchers_completion_does_not() {
    let journal = HeldJournal::default();
    let store = MemoryStore::with_journal(
        MemoryConfig {
            shards: 1,
            max_records: 1000,
            partitions: 1,
        },
        ManualClock::new(START_MS),
        journal.clone(),
        1,
    );
    let day = Duration::from_secs(86_400);
    for id in ["a", "b"] {
        // An admit waits: the platform's 200 says the event is durable.
        assert!(at_once(store.admit(event(id, None), &[key(id)], day)).is_none());
    }
    journal.0.durable.store(true, Ordering::SeqCst);
    for id in ["a", "b"] {
        let admission = block_on(store.admit(event(id, None), &[key(id)], day)).expect("admit");
        assert!(
            matches!(admission, Admission::Duplicate { .. }),
            "{admission:?}"
        );
    }
    let pulled = block_on(store.pull(0, 10)).expect("pull");
    assert_eq!(pulled.len(), 2);
    journal.0.durable.store(false, Ordering::SeqCst);

    let leases: Vec<_> = pulled
        .iter()
        .map(|delivery| {
            // A claim does not wait: a crash ends every lease.
            match at_once(store.claim(&delivery.key, 0, Duration::from_secs(30))) {
                Some(Ok(Claim::Acquired(lease))) => lease,
                other => panic!("a claim that waited or failed: {other:?}"),
            }
        })
        .collect();
    let before = journal.0.appended.load(Ordering::SeqCst);
    // The dispatcher's complete-and-ack answers before the sync, journaled all the same.
    let fence = at_once(store.complete_and_ack(&leases[0], day, None, pulled[0].id));
    assert!(
        matches!(fence, Some(Ok(FenceCheck::Accepted))),
        "complete-and-ack waited: {fence:?}"
    );
    assert!(journal.0.appended.load(Ordering::SeqCst) > before);
    // `complete` waits: its caller is told the key is done.
    assert!(at_once(store.complete(&leases[1], day, None)).is_none());
    journal.0.durable.store(true, Ordering::SeqCst);
    let record = block_on(store.record(&pulled[0].key, 0))
        .expect("record")
        .expect("kept");
    assert!(
        matches!(record.state, oncegate_core::RecordState::Completed { .. }),
        "{record:?}"
    );
}
