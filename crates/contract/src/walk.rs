//! Random walks over a store's transitions, for checks that hold whatever the steps were.

use std::collections::HashMap;
use std::time::Duration;

use oncegate_core::{Claim, FenceCheck, KeyHash, Lease, QueueId, Store, StoreError};

use crate::{block_on, event, key};

/// One thread's random walk over a few shared keys (`seed` picks the steps): every transition
/// the dispatcher makes, with retentions and leases of seconds to minutes, colliding with
/// whatever other threads walk the same keys. For checks that hold whatever the steps were
/// (counts against a census).
pub fn walk<S: Store>(store: &S, seed: u64, steps: usize, ids: &[String]) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut leases: HashMap<KeyHash, (Lease, Option<QueueId>)> = HashMap::new();
    let seconds = |rng: &mut fastrand::Rng| Duration::from_secs(rng.u64(1..=240));
    block_on(async {
        for _ in 0..steps {
            let id = &ids[rng.usize(..ids.len())];
            let k = key(id);
            let partition = oncegate_core::event::partition_of(
                event(id, Some(id)).order_hash(),
                store.partitions(),
            );
            match rng.u8(0..7) {
                0 | 1 => {
                    // A bounded store full of held records refuses: that is no failure here.
                    match store
                        .admit(event(id, Some(id)), &[k], seconds(&mut rng))
                        .await
                    {
                        Ok(_) | Err(StoreError::Full { .. }) => {}
                        Err(error) => panic!("admit: {error}"),
                    }
                }
                2 => {
                    if let Claim::Acquired(lease) | Claim::TookOver(lease) = store
                        .claim(&k, partition, seconds(&mut rng))
                        .await
                        .expect("claim")
                    {
                        leases.insert(k, (lease, None));
                    }
                }
                3 => {
                    for (delivery, claim) in store
                        .pull_claimed(partition, 2, seconds(&mut rng))
                        .await
                        .expect("pull")
                    {
                        if let Ok(Claim::Acquired(lease) | Claim::TookOver(lease)) = claim {
                            leases.insert(delivery.key, (lease, Some(delivery.id)));
                        }
                    }
                }
                4 => {
                    if let Some((lease, _)) = leases.get(&k) {
                        let _: FenceCheck =
                            store.renew(lease, seconds(&mut rng)).await.expect("renew");
                    }
                }
                5 => {
                    if let Some((lease, id)) = leases.remove(&k) {
                        let _ = match id {
                            Some(id) => store
                                .complete_and_ack(&lease, seconds(&mut rng), None, id)
                                .await
                                .expect("complete and ack"),
                            None => store
                                .complete(&lease, seconds(&mut rng), None)
                                .await
                                .expect("complete"),
                        };
                    }
                }
                _ => {
                    if let Some((lease, _)) = leases.remove(&k) {
                        let _ = store.release(&lease).await.expect("release");
                    }
                }
            }
        }
    });
}
