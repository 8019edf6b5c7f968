//! What the dispatcher does with a handed-out event, decided from what is known at each point
//! of its way — the claim's answer, the checks before its handler, the handler's result — apart
//! from doing it (`act.rs`), as `oncegate_core::transition` decides a record's next state apart
//! from the stores that write it. Every case is a row of a table, tested one by one below.

use std::time::Duration;

use super::retries::Next;
use crate::sink::SinkError;

/// Trouble said in the dispatcher's periodic summary (never a line per event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Note {
    /// The summary's name for it.
    pub(crate) what: &'static str,
    /// What went wrong.
    pub(crate) detail: String,
}

impl Note {
    fn new(what: &'static str, detail: impl Into<String>) -> Self {
        Self {
            what,
            detail: detail.into(),
        }
    }
}

/// Why an event is done without its handler running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// No route takes its type.
    Unrouted,
    /// Older than what its chat's watermark has seen.
    Stale,
    /// A later event of its chat's version chain was applied already.
    Superseded,
}

/// The next thing done with a handed-out event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Run the route's handler.
    Run,
    /// Completed before a crash that came before the ack: ack it.
    Ack,
    /// Back to the queue, not before `at_ms`; its key was not taken here.
    Retry { at_ms: u64, note: Option<Note> },
    /// Give its key back and the event to the queue for a second later: a store call failed.
    ReleaseAndRetry(Note),
    /// Done without its handler: complete and ack.
    Skip(Skip),
    /// Its handler succeeded: complete and ack.
    Delivered,
    /// Its handler failed: give its key back, the event to the queue after `delay`.
    RetryAfter { delay: Duration, reason: String },
    /// Give its key back, the event to the dead letters.
    DeadLetter { reason: String, why: Letter },
}

/// Why an event goes to the dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Letter {
    /// No attempt left, or an answer that will never change.
    GaveUp,
    /// It held its chat as long as the route allows.
    SetAside,
    /// Its endpoint answered that it is gone: the route stops until resumed.
    Gone,
    /// Its route's endpoint was gone before it ran.
    RouteGone,
}

/// What the hand-out's claim of the event's key answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Granted.
    Run,
    /// Completed already.
    Done,
    /// Someone holds it until then.
    InFlight { until_ms: u64 },
    /// Held for another payload (an event's claim names none: not expected).
    Conflict,
    /// The store did not answer.
    Failed(String),
}

/// After the claim, at `now_ms`.
pub(crate) fn claimed(claim: Claim, now_ms: u64) -> Step {
    let later = now_ms.saturating_add(1000);
    match claim {
        Claim::Run => Step::Run,
        Claim::Done => Step::Ack,
        Claim::InFlight { until_ms } => Step::Retry {
            at_ms: until_ms,
            note: None,
        },
        Claim::Conflict => Step::Retry {
            at_ms: later,
            note: Some(Note::new(
                "claim_conflict",
                "the event's key is held for a payload",
            )),
        },
        Claim::Failed(error) => Step::Retry {
            at_ms: later,
            note: Some(Note::new("claim_failed", error)),
        },
    }
}

/// A check asked before the handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Check {
    /// Not asked (it does not apply, or an earlier answer decided).
    Unasked,
    /// Asked: the event goes on.
    Passed,
    /// Asked: the event is done without its handler.
    Hit,
    /// The store did not answer.
    Failed(String),
}

/// What is known before the handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Before {
    /// A multi-tenant source's push applied to the store, or why not.
    pub(crate) tenancy: Result<(), String>,
    /// A route takes the event's type.
    pub(crate) routed: bool,
    /// The chat's watermark.
    pub(crate) stale: Check,
    /// The chat's version chain.
    pub(crate) superseded: Check,
    /// The route's endpoint said it is gone: the dead letter's reason.
    pub(crate) gone: Option<String>,
}

/// Before the handler, in this order: the tenancy push, the route, the watermark, the version
/// chain, the route's endpoint.
pub(crate) fn before_run(before: Before) -> Step {
    if let Err(error) = before.tenancy {
        return Step::ReleaseAndRetry(Note::new("tenancy_failed", error));
    }
    if !before.routed {
        return Step::Skip(Skip::Unrouted);
    }
    for (check, skip) in [
        (before.stale, Skip::Stale),
        (before.superseded, Skip::Superseded),
    ] {
        match check {
            Check::Unasked | Check::Passed => {}
            Check::Hit => return Step::Skip(skip),
            Check::Failed(error) => {
                return Step::ReleaseAndRetry(Note::new("watermark_failed", error));
            }
        }
    }
    match before.gone {
        Some(reason) => Step::DeadLetter {
            reason,
            why: Letter::RouteGone,
        },
        None => Step::Run,
    }
}

/// After the handler's attempt number `attempt` (from 0): its result, and for a failure what
/// the route's retry rule chose.
pub(crate) fn after_run(result: Result<(), (&SinkError, Next)>, attempt: u32) -> Step {
    let (error, next) = match result {
        Ok(()) => return Step::Delivered,
        Err(failed) => failed,
    };
    let (reason, why) = match (next, error) {
        (Next::Retry(delay), error) => {
            return Step::RetryAfter {
                delay,
                reason: error.to_string(),
            };
        }
        (Next::SetAside(held), error) => (
            format!(
                "set aside after holding its chat's later events for {} (the route's hold_chat): \
             they went on without it; replay it once the endpoint takes it. Last attempt ({}): \
             {error}",
                humantime::format_duration(Duration::from_secs(held.as_secs())),
                attempt + 1
            ),
            Letter::SetAside,
        ),
        (Next::GiveUp, SinkError::Transient(reason) | SinkError::RetryAfter { reason, .. }) => (
            format!("gave up after {} attempts: {reason}", attempt + 1),
            Letter::GaveUp,
        ),
        (Next::GiveUp, SinkError::Permanent(reason)) => (reason.clone(), Letter::GaveUp),
        (Next::GiveUp, SinkError::Gone(reason)) => (reason.clone(), Letter::Gone),
    };
    Step::DeadLetter { reason, why }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn each_claim_answer_has_its_step() {
        let cases = [
            (Claim::Run, Step::Run),
            (Claim::Done, Step::Ack),
            (
                Claim::InFlight {
                    until_ms: NOW + 30_000,
                },
                Step::Retry {
                    at_ms: NOW + 30_000,
                    note: None,
                },
            ),
            (
                Claim::Conflict,
                Step::Retry {
                    at_ms: NOW + 1000,
                    note: Some(Note::new(
                        "claim_conflict",
                        "the event's key is held for a payload",
                    )),
                },
            ),
            (
                Claim::Failed("redis: timed out".into()),
                Step::Retry {
                    at_ms: NOW + 1000,
                    note: Some(Note::new("claim_failed", "redis: timed out")),
                },
            ),
        ];
        for (claim, step) in cases {
            assert_eq!(claimed(claim.clone(), NOW), step, "{claim:?}");
        }
    }

    fn before() -> Before {
        Before {
            tenancy: Ok(()),
            routed: true,
            stale: Check::Passed,
            superseded: Check::Passed,
            gone: None,
        }
    }

    /// Every combination of what is known before the handler, against the order the checks
    /// decide in: the first that decides wins.
    #[test]
    fn before_the_handler_the_first_check_that_decides_wins() {
        let tenancies = [Ok(()), Err("ticket store down".to_owned())];
        let checks = [
            Check::Unasked,
            Check::Passed,
            Check::Hit,
            Check::Failed("watermark store down".into()),
        ];
        let gones = [None, Some("not delivered: gone".to_owned())];
        let mut rows = 0;
        for tenancy in &tenancies {
            for routed in [false, true] {
                for stale in &checks {
                    for superseded in &checks {
                        for gone in &gones {
                            let known = Before {
                                tenancy: tenancy.clone(),
                                routed,
                                stale: stale.clone(),
                                superseded: superseded.clone(),
                                gone: gone.clone(),
                            };
                            let expected = if let Err(error) = tenancy {
                                Step::ReleaseAndRetry(Note::new("tenancy_failed", error.clone()))
                            } else if !routed {
                                Step::Skip(Skip::Unrouted)
                            } else if *stale == Check::Hit {
                                Step::Skip(Skip::Stale)
                            } else if let Check::Failed(error) = stale {
                                Step::ReleaseAndRetry(Note::new("watermark_failed", error.clone()))
                            } else if *superseded == Check::Hit {
                                Step::Skip(Skip::Superseded)
                            } else if let Check::Failed(error) = superseded {
                                Step::ReleaseAndRetry(Note::new("watermark_failed", error.clone()))
                            } else if let Some(reason) = gone {
                                Step::DeadLetter {
                                    reason: reason.clone(),
                                    why: Letter::RouteGone,
                                }
                            } else {
                                Step::Run
                            };
                            assert_eq!(before_run(known.clone()), expected, "{known:?}");
                            rows += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(rows, 2 * 2 * 4 * 4 * 2);
        assert_eq!(before_run(before()), Step::Run);
    }

    #[test]
    fn after_the_handler_each_result_and_rule_has_its_step() {
        let transient = SinkError::Transient("downstream answered 503".into());
        let later = SinkError::RetryAfter {
            reason: "downstream answered 429".into(),
            after: Duration::from_secs(30),
        };
        let permanent = SinkError::Permanent("downstream answered 422: bad payload".into());
        let gone = SinkError::Gone("downstream answered 410".into());
        assert_eq!(after_run(Ok(()), 0), Step::Delivered);
        for error in [&transient, &later, &permanent, &gone] {
            assert_eq!(
                after_run(Err((error, Next::Retry(Duration::from_secs(2)))), 1),
                Step::RetryAfter {
                    delay: Duration::from_secs(2),
                    reason: error.to_string()
                },
                "{error:?}: the rule said retry"
            );
            match after_run(Err((error, Next::SetAside(Duration::from_secs(600)))), 4) {
                Step::DeadLetter { reason, why } => {
                    assert_eq!(why, Letter::SetAside, "{error:?}");
                    assert!(
                        reason
                            .starts_with("set aside after holding its chat's later events for 10m"),
                        "{reason}"
                    );
                    assert!(
                        reason.ends_with(&format!("Last attempt (5): {error}")),
                        "{reason}"
                    );
                }
                other => panic!("{error:?}: set aside is a dead letter, not {other:?}"),
            }
        }
        assert_eq!(
            after_run(Err((&transient, Next::GiveUp)), 2),
            Step::DeadLetter {
                reason: "gave up after 3 attempts: downstream answered 503".into(),
                why: Letter::GaveUp
            }
        );
        assert_eq!(
            after_run(Err((&later, Next::GiveUp)), 0),
            Step::DeadLetter {
                reason: "gave up after 1 attempts: downstream answered 429".into(),
                why: Letter::GaveUp
            }
        );
        assert_eq!(
            after_run(Err((&permanent, Next::GiveUp)), 0),
            Step::DeadLetter {
                reason: "downstream answered 422: bad payload".into(),
                why: Letter::GaveUp
            }
        );
        assert_eq!(
            after_run(Err((&gone, Next::GiveUp)), 0),
            Step::DeadLetter {
                reason: "downstream answered 410".into(),
                why: Letter::Gone
            }
        );
    }
}
