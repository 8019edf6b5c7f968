//! A `sink = "kafka"` route's brokers, topic and client settings.

use crate::checks::Severity;
use crate::*;

/// Client settings the Kafka sink fixes: each event counts as delivered only once every in-sync
/// replica has it, and the producer's own retries never write it twice.
pub const KAFKA_FIXED: [(&str, &str); 2] = [("acks", "all"), ("enable.idempotence", "true")];

/// Whether `topic` is a name Kafka accepts: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn valid_topic(topic: &str) -> bool {
    (1..=249).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The topic of one event: `template` with `{tenant}` and `{agent}` replaced by the event's
/// owner, `None` when that is not a topic name Kafka accepts (too long, or a template that is
/// not one). Letters, digits and `-` of an id stay; every other byte becomes `_` and its two
/// hex digits (`_` alone for an owner the event has not), so that two tenants never share a
/// topic and an id cannot make `.`, `..` or a byte Kafka refuses.
/// A template without placeholders is its own topic, borrowed: no allocation per event.
pub fn kafka_topic<'t>(
    template: &'t str,
    tenant: Option<&str>,
    agent: Option<&str>,
) -> Option<std::borrow::Cow<'t, str>> {
    let topic = if template.contains('{') {
        std::borrow::Cow::Owned(
            template
                .replace("{tenant}", &topic_part(tenant))
                .replace("{agent}", &topic_part(agent)),
        )
    } else {
        std::borrow::Cow::Borrowed(template)
    };
    valid_topic(&topic).then_some(topic)
}

/// An owner's id as it stands in a topic name (see [`kafka_topic`]).
fn topic_part(id: Option<&str>) -> String {
    let Some(id) = id.filter(|id| !id.is_empty()) else {
        return "_".to_owned();
    };
    let mut part = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            part.push(char::from(byte));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            part.push('_');
            part.push(char::from(HEX[usize::from(byte >> 4)]));
            part.push(char::from(HEX[usize::from(byte & 15)]));
        }
    }
    part
}

/// A broker list's hosts that are not loopback.
fn remote_brokers(brokers: &str) -> Vec<&str> {
    brokers
        .split(',')
        .map(str::trim)
        .filter(|broker| {
            let host = broker
                .rsplit_once(':')
                .map_or(*broker, |(host, _)| host)
                .trim_start_matches('[')
                .trim_end_matches(']');
            host != "localhost"
                && !host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
        .collect()
}

impl RouteConfig {
    /// A `kafka` client setting's value, resolved and in lower case (librdkafka reads its
    /// enumerations without regard to case); `None` when unset or its secret does not resolve.
    pub fn kafka_value(&self, name: &str) -> Option<String> {
        self.kafka
            .get(name)
            .and_then(|value| value.resolve().ok())
            .map(|value| value.to_ascii_lowercase())
    }

    /// Whether the Kafka client settings need librdkafka's TLS (OpenSSL, the `kafka-tls`
    /// build): an SSL protocol, an `ssl.*` setting, or SASL/SCRAM, which librdkafka builds
    /// with OpenSSL only.
    pub fn kafka_needs_tls(&self) -> bool {
        let protocol = self.kafka_value("security.protocol").unwrap_or_default();
        matches!(protocol.as_str(), "ssl" | "sasl_ssl")
            || self.kafka.keys().any(|name| name.starts_with("ssl."))
            || ["sasl.mechanism", "sasl.mechanisms"]
                .iter()
                .any(|name| self.kafka_value(name).is_some_and(|m| m.contains("scram")))
    }
}

/// A route's Kafka settings: needed where `sink = "kafka"`, refused elsewhere.
pub(crate) fn check(
    route: &RouteConfig,
    at: &dyn Fn(&str) -> String,
    report: &mut impl FnMut(Severity, &str, String),
) {
    if route.sink != SinkKind::Kafka {
        if route.brokers.is_some() || route.topic.is_some() || !route.kafka.is_empty() {
            report(
                Severity::Error,
                &at("brokers"),
                "brokers, topic and kafka belong to sink = \"kafka\"".into(),
            );
        }
        return;
    }
    match route.brokers.as_deref().map(str::trim) {
        None | Some("") => report(
            Severity::Error,
            &at("brokers"),
            "sink = \"kafka\" needs brokers, e.g. \"kafka-1:9092,kafka-2:9092\"".into(),
        ),
        Some(brokers) => {
            let protocol = route
                .kafka_value("security.protocol")
                .unwrap_or_else(|| "plaintext".into());
            let remote = remote_brokers(brokers);
            if matches!(protocol.as_str(), "plaintext" | "sasl_plaintext") && !remote.is_empty() {
                report(
                    Severity::AtRisk,
                    &at("brokers"),
                    format!(
                        "events (decrypted messages) travel to {} unencrypted: set \
                         kafka.\"security.protocol\" = \"SSL\" or \"SASL_SSL\"",
                        remote.join(", ")
                    ),
                );
            }
        }
    }
    match route.topic.as_deref() {
        None => report(
            Severity::Error,
            &at("topic"),
            "sink = \"kafka\" needs a topic".into(),
        ),
        Some(topic) if kafka_topic(topic, None, None).is_none() => report(
            Severity::Error,
            &at("topic"),
            format!(
                "{topic:?} is not a Kafka topic name: 1 to 249 of letters, digits, '.', '_' and \
                 '-', where {{tenant}} and {{agent}} may stand for the event's owner"
            ),
        ),
        Some(_) => {}
    }
    for (name, value) in &route.kafka {
        let field = at(&format!("kafka.\"{name}\""));
        match value.resolve() {
            Err(message) => report(Severity::Error, &field, message),
            Ok(value) => {
                if let Some((_, fixed)) = KAFKA_FIXED.iter().find(|(fixed, _)| fixed == name)
                    && !value.eq_ignore_ascii_case(fixed)
                {
                    report(
                        Severity::Error,
                        &field,
                        format!(
                            "the Kafka sink sets {name} = {fixed}: an event counts as delivered \
                             only once the brokers have it, written once; leave it out"
                        ),
                    );
                }
            }
        }
        if name == "bootstrap.servers" {
            report(
                Severity::Error,
                &field,
                "name the brokers in the route's brokers setting".into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(extra: &str) -> Vec<(Severity, String)> {
        let route: RouteConfig =
            toml::from_str(&format!("events = [\"*\"]\nsink = \"kafka\"\n{extra}")).expect("route");
        let mut found = Vec::new();
        check(&route, &|f| f.to_owned(), &mut |severity, field, _| {
            found.push((severity, field.to_owned()))
        });
        found
    }

    /// What needs the `kafka-tls` build: the SSL protocols in any case, an `ssl.*` setting,
    /// SCRAM (librdkafka has it with OpenSSL only); PLAINTEXT, SASL_PLAINTEXT with PLAIN and
    /// nothing set do not.
    #[test]
    fn tls_and_scram_need_the_tls_build() {
        let needs = |kafka: &str| {
            let route: RouteConfig = toml::from_str(&format!(
                "events = [\"*\"]\nsink = \"kafka\"\nkafka = {{ {kafka} }}"
            ))
            .expect("route");
            route.kafka_needs_tls()
        };
        for tls in [
            "\"security.protocol\" = \"SSL\"",
            "\"security.protocol\" = \"sasl_ssl\"",
            "\"ssl.ca.location\" = \"/etc/ca.pem\"",
            "\"security.protocol\" = \"SASL_PLAINTEXT\", \"sasl.mechanism\" = \"SCRAM-SHA-512\"",
            "\"sasl.mechanisms\" = \"scram-sha-256\"",
        ] {
            assert!(needs(tls), "{tls}");
        }
        for plain in [
            "",
            "\"security.protocol\" = \"PLAINTEXT\"",
            "\"security.protocol\" = \"SASL_PLAINTEXT\", \"sasl.mechanism\" = \"PLAIN\"",
        ] {
            assert!(!needs(plain), "{plain}");
        }
    }

    #[test]
    fn a_topic_names_its_tenant_and_agent_and_no_two_tenants_share_one() {
        assert_eq!(
            kafka_topic("chat.{tenant}.{agent}", Some("ww8e1c5f2a"), Some("1000002")).as_deref(),
            Some("chat.ww8e1c5f2a.1000002")
        );
        assert_eq!(
            kafka_topic("chat-{tenant}", None, None).as_deref(),
            Some("chat-_")
        );
        assert_eq!(
            kafka_topic("chat-{tenant}", Some(""), None).as_deref(),
            Some("chat-_")
        );
        // What Kafka would refuse, or take for a separator, is written out.
        assert_eq!(
            kafka_topic("{tenant}", Some("../a b_c"), None).as_deref(),
            Some("_2E_2E_2Fa_20b_5Fc")
        );
        assert_eq!(
            kafka_topic("{tenant}", Some("."), None).as_deref(),
            Some("_2E")
        );
        // Distinct ids, distinct topics: `_` never stands for itself.
        let ids = ["a_b", "a_5Fb", "a.b", "a-b", "a", "_", "ab", "企业"];
        let topics: std::collections::HashSet<_> = ids
            .iter()
            .map(|id| kafka_topic("t.{tenant}", Some(id), None).expect("a topic"))
            .collect();
        assert_eq!(topics.len(), ids.len(), "{topics:?}");
        // Too long once filled in: no topic (the delivery is refused, not cut short).
        assert_eq!(kafka_topic("{tenant}", Some(&"x".repeat(250)), None), None);
        assert_eq!(kafka_topic("a{tenant", Some("x"), None), None);
        assert_eq!(kafka_topic("a{other}", Some("x"), None), None);
    }

    #[test]
    fn a_kafka_route_names_brokers_and_a_topic_and_keeps_acks_all() {
        assert_eq!(
            problems("brokers = \"127.0.0.1:9092\"\ntopic = \"chat-events\""),
            []
        );
        assert_eq!(
            problems(""),
            [
                (Severity::Error, "brokers".to_owned()),
                (Severity::Error, "topic".to_owned())
            ]
        );
        assert_eq!(
            problems("brokers = \"127.0.0.1:9092\"\ntopic = \"a/b\""),
            [(Severity::Error, "topic".to_owned())]
        );
        assert_eq!(
            problems("brokers = \"127.0.0.1:9092\"\ntopic = \"chat.{tenant}.{agent}\""),
            []
        );
        for template in ["chat.{corp}", "chat.{tenant", "chat.{{tenant}}"] {
            assert_eq!(
                problems(&format!(
                    "brokers = \"127.0.0.1:9092\"\ntopic = \"{template}\""
                )),
                [(Severity::Error, "topic".to_owned())],
                "{template}"
            );
        }
        assert_eq!(
            problems("brokers = \"127.0.0.1:9092\"\ntopic = \"t\"\nkafka = { acks = \"1\" }"),
            [(Severity::Error, "kafka.\"acks\"".to_owned())]
        );
        assert_eq!(
            problems(
                "brokers = \"kafka-1:9092,127.0.0.1:9092\"\ntopic = \"t\"\n\
                 kafka = { \"security.protocol\" = \"SASL_PLAINTEXT\" }"
            ),
            [(Severity::AtRisk, "brokers".to_owned())]
        );
        assert_eq!(
            problems(
                "brokers = \"kafka-1:9092\"\ntopic = \"t\"\n\
                 kafka = { \"security.protocol\" = \"SASL_SSL\", \"sasl.password\" = { env = \"PATH\" } }"
            ),
            []
        );
    }
}
