//! The store contract: one suite of tests, written once, run against every backend.
//!
//! A backend joins with one line in its tests:
//!
//! ```text
//! oncegate_contract::contract_suite!(|clock| MyStore::with_clock(clock));
//! ```
//!
//! The factory gets a [`ManualClock`] and must build a fresh, empty store on it.

pub mod cases;
pub mod model;
pub mod walk;

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use oncegate_core::{Event, KeyHash, ManualClock, key_for};

/// Where every contract clock starts: a whole second, so second-granular backends are exact.
pub const START_MS: u64 = 1_700_000_000_000;

/// Runs a future to completion on a fresh single-threaded runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(future),
        Err(error) => panic!("cannot start a tokio runtime for the contract suite: {error}"),
    }
}

/// A fresh manual clock at [`START_MS`].
pub fn clock() -> ManualClock {
    ManualClock::new(START_MS)
}

/// A test event with id `id` in chat `chat`.
pub fn event(id: &str, chat: Option<&str>) -> Event {
    Event {
        platform: Arc::from("feishu"),
        app: Arc::from("cli_contract"),
        tenant: Some(Arc::from("tenant")),
        event_id: Arc::from(id),
        event_type: Arc::from("im.message.receive_v1"),
        created_at_ms: START_MS,
        order_key: chat.map(Arc::from),
        payload: Bytes::from(format!("{{\"id\":\"{id}\"}}")),
    }
}

/// The event-id key of a test event.
pub fn key(id: &str) -> KeyHash {
    key_for("feishu", "cli_contract", "event_id", id)
}

/// `error` with its causes, as `anyhow`'s `{:#}` and an error chain in a log print it: a store's
/// refusal must say its OS error once there, not again for each cause that repeats it.
pub fn printed(error: &dyn std::error::Error) -> String {
    let mut said = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        said.push_str(": ");
        said.push_str(&next.to_string());
        cause = next.source();
    }
    said
}

/// Generates one `#[test]` per case of the shared-state contract ([`oncegate_core::StateStore`])
/// for the store built by `$make`.
#[macro_export]
macro_rules! state_suite {
    ($make:expr) => {
        $crate::contract_suite!(@cases $make;
            state_changes_are_compare_and_set,
            state_names_are_opaque_and_bounded,
            state_values_expire,
            state_lists_in_pages,
            racing_state_writers_lose_no_update,
        );
    };
}

/// Generates one `#[test]` per contract case for the store built by `$make` (a closure from
/// `ManualClock` to the store).
#[macro_export]
macro_rules! contract_suite {
    ($make:expr) => {
        $crate::contract_suite!(@cases $make;
            admit_marks_and_queues_once,
            admit_with_several_keys_is_all_or_nothing,
            admit_needs_a_key,
            admitted_keys_expire_after_retention,
            claim_walks_the_state_machine,
            claim_of_an_unknown_key_is_a_business_key,
            stale_holder_cannot_touch_the_new_holders_record,
            records_live_in_their_events_partition,
            renew_extends_only_the_current_lease,
            tokens_increase_with_every_grant,
            completed_records_expire_after_retention,
            complete_and_ack_is_one_step,
            a_key_claimed_for_one_payload_conflicts_with_another,
            an_admitted_key_keeps_its_first_claimers_fingerprint,
            a_readmitted_key_forgets_the_old_fingerprint,
            racing_payloads_one_wins_each_key,
            queue_hands_out_in_order_per_key,
            pull_claimed_claims_every_hand_out,
            ranked_pulls_serve_the_least_loaded_tenant,
            a_first_event_passes_its_tenants_backlog_not_its_chats,
            queue_retry_waits_and_counts_attempts,
            queue_dead_letters_keep_the_reason,
            dead_letters_replay_once_and_purge,
            racing_replays_queue_each_dead_letter_once,
            queue_unknown_ids_are_refused,
            watermarks_only_move_up_and_expire,
            rates_grant_a_burst_then_the_sustained_rate,
            racing_takers_never_exceed_the_budget,
            adjusted_buckets_give_back_and_hold,
            lookups_and_stats_for_operators,
            queue_summaries_and_listings_show_each_partition,
            racing_admits_admit_once,
            racing_claims_grant_one_live_lease,
            racing_pullers_never_share_an_event,
            random_operations_match_the_model,
        );
    };
    (@cases $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::cases::$name($make);
            }
        )*
    };
}
