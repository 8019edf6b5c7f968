//! A route's retries: the schedule of its delivery attempts, and how long an event that keeps
//! failing may hold its chat's later events back.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::checks::{Severity, human};
use crate::*;

/// The waits of the Standard Webhooks schedule (Svix's, which the spec's senders follow): after
/// the first attempt fails, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h — eight attempts over
/// about 27.5 hours.
pub const STANDARD_WEBHOOKS_SCHEDULE: [Duration; 7] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
];

/// The name that stands for [`STANDARD_WEBHOOKS_SCHEDULE`] in a configuration.
const STANDARD_WEBHOOKS: &str = "standard-webhooks";

/// The longest wait one schedule entry may name: beyond it an event outlives the retention of
/// the keys that catch its repeats.
const LONGEST_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most waits a schedule may list: `dispatcher.max_attempts`'s bound, since every wait is
/// an attempt (and each failure walks the waits before it).
const MOST_WAITS: usize = 1_000;

/// A route's retry schedule: the wait after each failed attempt, in order. An event is tried
/// once more than the schedule has entries, then dead-lettered. Written as a list of durations
/// (`["5s", "1m", "10m"]`) or as `"standard-webhooks"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule(pub Vec<Duration>);

impl RetrySchedule {
    /// The Standard Webhooks schedule.
    pub fn standard_webhooks() -> Self {
        Self(STANDARD_WEBHOOKS_SCHEDULE.to_vec())
    }
}

impl Serialize for RetrySchedule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0 == STANDARD_WEBHOOKS_SCHEDULE {
            return serializer.serialize_str(STANDARD_WEBHOOKS);
        }
        let text: Vec<String> = self
            .0
            .iter()
            .map(|wait| humantime::format_duration(*wait).to_string())
            .collect();
        text.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RetrySchedule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Written)
    }
}

/// Reads a schedule's name or its list of waits; anything else is told how to write one.
struct Written;

fn unreadable<E: serde::de::Error>(text: &str, why: &dyn std::fmt::Display) -> E {
    E::custom(format!(
        "{text:?} is not a retry schedule ({why}); write \"{STANDARD_WEBHOOKS}\" or a list of \
         waits like [\"5s\", \"5m\", \"30m\"]"
    ))
}

impl<'de> serde::de::Visitor<'de> for Written {
    type Value = RetrySchedule;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a retry schedule: \"{STANDARD_WEBHOOKS}\" or a list of waits like [\"5s\", \"5m\"]"
        )
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<RetrySchedule, E> {
        if name == STANDARD_WEBHOOKS {
            Ok(RetrySchedule::standard_webhooks())
        } else {
            Err(unreadable(name, &"no schedule has this name"))
        }
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut waits: A,
    ) -> Result<RetrySchedule, A::Error> {
        let mut schedule = Vec::new();
        while let Some(text) = waits.next_element::<String>()? {
            schedule
                .push(humantime::parse_duration(&text).map_err(|error| unreadable(&text, &error))?);
        }
        Ok(RetrySchedule(schedule))
    }
}

/// A route's `retry_schedule` and `hold_chat`.
pub(crate) fn check(
    route: &RouteConfig,
    retention: Duration,
    at: &dyn Fn(&str) -> String,
    report: &mut impl FnMut(Severity, &str, String),
) {
    if let Some(schedule) = &route.retry_schedule {
        let span: Duration = schedule.0.iter().sum();
        if span > retention {
            report(
                Severity::Warning,
                &at("retry_schedule"),
                format!(
                    "its waits add up to {}, longer than dedup.retention ({}): an event still \
                     retrying then has outlived its seen-marks, and a repeat of it would be \
                     admitted again. Raise dedup.retention to at least {}",
                    human(span),
                    human(retention),
                    human(span)
                ),
            );
        }
        if schedule.0.is_empty() {
            report(
                Severity::Error,
                &at("retry_schedule"),
                "an empty schedule retries nothing; leave retry_schedule out to use the \
                 dispatcher's backoff, or name waits like [\"5s\", \"5m\"]"
                    .into(),
            );
        }
        if schedule.0.len() > MOST_WAITS {
            report(
                Severity::Error,
                &at("retry_schedule"),
                format!(
                    "{} waits: a schedule lists at most {MOST_WAITS} (as max_attempts is \
                     bounded); longer retrying wants longer waits, not more of them",
                    schedule.0.len()
                ),
            );
        }
        if let Some(wait) = schedule
            .0
            .iter()
            .find(|wait| wait.is_zero() || **wait > LONGEST_WAIT)
        {
            report(
                Severity::Error,
                &at("retry_schedule"),
                format!(
                    "a wait of {} is out of bounds: each wait must be above zero and at most {}",
                    human(*wait),
                    human(LONGEST_WAIT)
                ),
            );
        }
        if route.reply {
            report(
                Severity::Error,
                &at("retry_schedule"),
                "a replying route is not retried by the gateway (the platform retries its \
                 call): leave retry_schedule out"
                    .into(),
            );
        }
    }
    if let Some(hold) = route.hold_chat {
        if hold.is_zero() {
            report(
                Severity::Error,
                &at("hold_chat"),
                "a chat held for zero time sets every failed event aside at once; name how \
                 long a failing event may hold its chat's later events, e.g. \"10m\""
                    .into(),
            );
        }
        if route.reply {
            report(
                Severity::Error,
                &at("hold_chat"),
                "a replying route holds no chat (its events are not queued): leave hold_chat out"
                    .into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(extra: &str) -> Result<RouteConfig, toml::de::Error> {
        toml::from_str(&format!("events = [\"*\"]\nsink = \"stdout\"\n{extra}"))
    }

    #[test]
    fn the_standard_schedule_is_named_or_written_out() {
        let named = route("retry_schedule = \"standard-webhooks\"").expect("named");
        let written =
            route("retry_schedule = [\"5s\", \"5m\", \"30m\", \"2h\", \"5h\", \"10h\", \"10h\"]")
                .expect("written");
        assert_eq!(named.retry_schedule, written.retry_schedule);
        let total: Duration = STANDARD_WEBHOOKS_SCHEDULE.iter().sum();
        assert_eq!(total, Duration::from_secs(27 * 3600 + 35 * 60 + 5));
        let back = toml::to_string(&named).expect("serialize");
        assert!(
            back.contains("retry_schedule = \"standard-webhooks\""),
            "{back}"
        );
        let custom =
            route("retry_schedule = [\"200ms\", \"1m\"]\nhold_chat = \"90s\"").expect("custom");
        assert_eq!(
            custom.retry_schedule,
            Some(RetrySchedule(vec![
                Duration::from_millis(200),
                Duration::from_secs(60)
            ]))
        );
        assert_eq!(custom.hold_chat, Some(Duration::from_secs(90)));
    }

    #[test]
    fn a_bad_schedule_says_what_to_write() {
        for bad in ["\"svix\"", "[\"5 parsecs\"]", "5"] {
            let error = route(&format!("retry_schedule = {bad}"))
                .expect_err(bad)
                .to_string();
            assert!(
                error.contains("standard-webhooks") || error.contains("retry schedule"),
                "{bad}: {error}"
            );
        }
        // One wait more than the bound (1 s each, so only the count is wrong).
        let too_long = format!(
            "retry_schedule = [{}]",
            vec!["\"1s\""; MOST_WAITS + 1].join(", ")
        );
        let mut problems = Vec::new();
        for extra in [
            "retry_schedule = []",
            "retry_schedule = [\"0s\"]",
            "retry_schedule = [\"30d\"]",
            too_long.as_str(),
            "hold_chat = \"0s\"",
        ] {
            let route = route(extra).expect(extra);
            check(
                &route,
                Duration::from_secs(60 * 86_400),
                &|field| field.to_owned(),
                &mut |severity, field, message| {
                    problems.push((extra, severity, field.to_owned(), message))
                },
            );
        }
        let fields: Vec<(&str, &str)> = problems
            .iter()
            .map(|(extra, _, field, _)| (*extra, field.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                ("retry_schedule = []", "retry_schedule"),
                ("retry_schedule = [\"0s\"]", "retry_schedule"),
                ("retry_schedule = [\"30d\"]", "retry_schedule"),
                (too_long.as_str(), "retry_schedule"),
                ("hold_chat = \"0s\"", "hold_chat"),
            ]
        );
        assert!(problems.iter().all(|(_, s, _, _)| *s == Severity::Error));
        // The standard schedule (27.5 h) outlives the default retention (24 h): said.
        let standard = route("retry_schedule = \"standard-webhooks\"").expect("standard");
        let mut said = Vec::new();
        check(
            &standard,
            Duration::from_secs(86_400),
            &|f| f.to_owned(),
            &mut |s, f, m| said.push((s, f.to_owned(), m)),
        );
        assert!(
            matches!(&said[..], [(Severity::Warning, field, message)]
                if field == "retry_schedule" && message.contains("dedup.retention")),
            "{said:?}"
        );
    }
}
