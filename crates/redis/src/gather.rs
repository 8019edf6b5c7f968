//! Calls of one kind to one partition, gathered into one script while the previous script of
//! that kind is on its way: the dispatcher claims and completes every event on its own, and
//! each script costs Redis a fixed few microseconds (and the gateway a task and a round trip)
//! beyond its keys' work. A call that finds nothing in flight goes out at once, alone or with
//! the calls made in the same instant; nobody waits for a timer.

use std::future::Future;

use tokio::sync::oneshot;

use super::*;

/// The most calls one script carries, so that one script holds Redis only briefly.
const BATCH_MAX: usize = 64;

type Answer<Reply> = oneshot::Sender<Result<Reply, StoreError>>;

/// The calls waiting for the next script of one kind and partition.
pub(super) struct Gather<Call, Reply> {
    waiting: std::sync::Mutex<Waiting<Call, Reply>>,
}

struct Waiting<Call, Reply> {
    calls: Vec<(Call, Answer<Reply>)>,
    /// A flusher runs: it takes the waiting calls when its script is back.
    flushing: bool,
}

impl<Call, Reply> Default for Gather<Call, Reply> {
    fn default() -> Self {
        Self {
            waiting: std::sync::Mutex::new(Waiting {
                calls: Vec::new(),
                flushing: false,
            }),
        }
    }
}

impl<Call, Reply> Gather<Call, Reply> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting<Call, Reply>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A kind of call that many callers' calls can share one script for.
pub(super) trait Batch<C: Clock>: Send + Sync + Sized + 'static {
    /// One call's answer.
    type Reply: Send + 'static;
    /// Where calls of this kind for `partition` wait.
    fn gather(inner: &Inner<C>, partition: u16) -> &Gather<Self, Self::Reply>;
    /// Runs `calls` (at least one) in one script: one answer per call, in order (a script
    /// that answers another number is an error; see [`one_each`]).
    fn run(
        inner: &Inner<C>,
        conn: &mut Conn,
        partition: u16,
        calls: &[Self],
    ) -> impl Future<Output = Result<Vec<Result<Self::Reply, StoreError>>, StoreError>> + Send;
}

impl<C: Clock> RedisStore<C> {
    /// Makes `call` in the next script of its kind for `partition`.
    pub(super) async fn gathered<B: Batch<C>>(
        &self,
        partition: u16,
        call: B,
    ) -> Result<B::Reply, StoreError> {
        self.inner.breaker.check()?;
        let (answer, answered) = oneshot::channel();
        let lead = {
            let mut waiting = B::gather(&self.inner, partition).lock();
            waiting.calls.push((call, answer));
            !std::mem::replace(&mut waiting.flushing, true)
        };
        if lead {
            self.handle
                .spawn(flush::<C, B>(self.inner.clone(), partition));
        }
        // The call's own deadline, as alone: a call behind a slow batch gives up in time (and
        // the flusher then skips it: nobody would take its answer).
        match tokio::time::timeout(self.inner.timeout * 2, answered).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(unavailable("the store stopped before answering")),
            Err(_) => Err(unavailable("no answer in time")),
        }
    }
}

/// A script's reply array, checked to hold one answer per call.
pub(super) fn one_each(reply: Value, calls: usize) -> Result<Vec<Value>, StoreError> {
    let answers = array(reply)?;
    if answers.len() == calls {
        Ok(answers)
    } else {
        Err(StoreError::Corrupt(format!(
            "{} answers from redis for {calls} calls in one script",
            answers.len()
        )))
    }
}

/// Ends a flusher: calls still waiting when it stops without taking them (its task was
/// dropped, or panicked) get an error instead of waiting forever, and the next call starts a
/// new flusher.
struct Flushing<'a, Call, Reply>(&'a Gather<Call, Reply>);

impl<Call, Reply> Drop for Flushing<'_, Call, Reply> {
    fn drop(&mut self) {
        let mut waiting = self.0.lock();
        waiting.flushing = false;
        waiting.calls.clear();
    }
}

/// Sends scripts of kind `B` for `partition`, one at a time, until no call waits.
async fn flush<C: Clock, B: Batch<C>>(inner: Arc<Inner<C>>, partition: u16) {
    let gather = B::gather(&inner, partition);
    let mut conn = inner.conn.clone();
    let flushing = Flushing(gather);
    loop {
        // Let the callers woken with the first one (a pull's hand-outs) join its script.
        tokio::task::yield_now().await;
        let (calls, answers): (Vec<B>, Vec<Answer<B::Reply>>) = {
            let mut waiting = gather.lock();
            if waiting.calls.is_empty() {
                waiting.flushing = false;
                std::mem::forget(flushing);
                return;
            }
            let take = waiting.calls.len().min(BATCH_MAX);
            waiting
                .calls
                .drain(..take)
                // Callers that gave up (their deadline, or their own caller went away): what
                // they asked for is not done, as their error said.
                .filter(|(_, answer)| !answer.is_closed())
                .unzip()
        };
        if calls.is_empty() {
            continue;
        }
        let result = tokio::time::timeout(inner.timeout * 2, async {
            inner.reachable(&mut conn).await?;
            B::run(&inner, &mut conn, partition, &calls).await
        })
        .await
        .unwrap_or_else(|_| Err(unavailable("no answer in time")));
        inner
            .breaker
            .record(!matches!(result, Err(StoreError::Unavailable(_))));
        match result {
            Ok(replies) => {
                for (answer, reply) in answers.into_iter().zip(replies) {
                    let _ = answer.send(reply);
                }
            }
            Err(error) => {
                for answer in answers {
                    let _ = answer.send(Err(error.clone()));
                }
            }
        }
    }
}
