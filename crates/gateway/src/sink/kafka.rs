//! Kafka: each event produced to a topic, keyed by its chat so that Kafka keeps the order the
//! gateway keeps, and delivered only once every in-sync replica has it (`acks = all`, an
//! idempotent producer). A crash between the brokers' ack and the gateway's completion
//! produces the event once more, with the same `idempotency-key` header.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, ClientContext};

use crate::sink::error::{SinkError, SinkSetupError};
use crate::sink::outgoing::{Delivered, Outgoing, Sink, envelope};

/// The producer's client: what librdkafka says goes to the debug log. A broker that cannot be
/// reached is said by every connection thread, again and again; the dispatcher's summary of
/// failed deliveries ("delivery_retried", one line per interval) says it once.
#[derive(Clone, Copy)]
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        tracing::debug!(?level, facility, message, "librdkafka");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, reason, "librdkafka");
    }
}

type KafkaProducer = FutureProducer<Quiet>;

/// Produces each event to one topic, or to its tenant's and agent's where the topic names
/// `{tenant}` or `{agent}`.
pub struct KafkaSink {
    settings: ClientConfig,
    producer: Mutex<Arc<KafkaProducer>>,
    topic: String,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaSink {
    /// The topic only: the settings may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// A producer for `topic` on `brokers` (`host:port`, comma-separated) with the client
    /// `settings` given (librdkafka's names), each delivery bounded by `timeout`. `acks = all`
    /// and `enable.idempotence = true` are set whatever `settings` say.
    pub fn new(
        brokers: &str,
        topic: &str,
        settings: &[(String, String)],
        timeout: Duration,
    ) -> Result<Self, SinkSetupError> {
        let mut config = ClientConfig::new();
        for (name, value) in settings {
            config.set(name, value);
        }
        config
            .set("bootstrap.servers", brokers)
            .set("message.timeout.ms", timeout.as_millis().max(1).to_string())
            // A few milliseconds of batching: the chats of one partition produce together.
            .set("linger.ms", "5");
        for (name, value) in oncegate_config::KAFKA_FIXED {
            config.set(name, value);
        }
        let producer = producer(&config)?;
        Ok(Self {
            settings: config,
            producer: Mutex::new(producer),
            topic: topic.to_owned(),
            timeout,
        })
    }

    fn producer(&self) -> Arc<KafkaProducer> {
        self.producer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// An idempotent producer that met a fatal error (its sequence numbers can no longer be
    /// trusted) serves nothing more: a new one takes its place for the next attempt.
    fn renew_if_fatal(&self, used: &Arc<KafkaProducer>) {
        let Some((code, reason)) = used.client().fatal_error() else {
            return;
        };
        tracing::warn!(?code, %reason, topic = %self.topic, "the Kafka producer failed for good; starting a new one");
        let mut current = self
            .producer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if Arc::ptr_eq(&current, used) {
            match producer(&self.settings) {
                Ok(fresh) => *current = fresh,
                Err(error) => tracing::warn!(%error, "cannot start a new Kafka producer"),
            }
        }
    }
}

fn producer(config: &ClientConfig) -> Result<Arc<KafkaProducer>, SinkSetupError> {
    config
        .create_with_context::<Quiet, KafkaProducer>(Quiet)
        .map(Arc::new)
        .map_err(|error| SinkSetupError::Client(format!("Kafka producer: {error}")))
}

/// Whether the brokers will never take this record as it is.
fn permanent(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::TopicAuthorizationFailed
        )
    )
}

impl Sink for KafkaSink {
    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a> {
        Box::pin(async move {
            let event = outgoing.event;
            let body = envelope(&outgoing);
            // The chat: one chat's events land on one partition, in the order they come.
            let key = event.order_key.as_deref().unwrap_or(outgoing.id);
            let mut headers = OwnedHeaders::new()
                .insert(Header {
                    key: "idempotency-key",
                    value: Some(outgoing.id),
                })
                .insert(Header {
                    key: "event-type",
                    value: Some(&*event.event_type),
                })
                .insert(Header {
                    key: "platform",
                    value: Some(&*event.platform),
                });
            // Whose the event is, as routes match it (a consumer filters a tenant's without
            // parsing the envelope).
            for (key, value) in [
                ("oncegate-tenant", outgoing.owner.tenant),
                ("oncegate-agent", outgoing.owner.agent),
            ] {
                if let Some(value) = value {
                    headers = headers.insert(Header {
                        key,
                        value: Some(value),
                    });
                }
            }
            // The event's trace goes on with its consumers' spans.
            if let Some(traceparent) = outgoing.traceparent {
                headers = headers.insert(Header {
                    key: "traceparent",
                    value: Some(traceparent),
                });
            }
            // A topic naming its tenant or agent is filled in per event (checked with the
            // configuration; only an id too long for a topic name is left to refuse here).
            let Some(topic) = oncegate_config::kafka_topic(
                &self.topic,
                outgoing.owner.tenant,
                outgoing.owner.agent,
            ) else {
                return Err(SinkError::Permanent(format!(
                    "the topic {:?} with this event's tenant and agent is longer than the 249 \
                     bytes Kafka allows",
                    self.topic
                )));
            };
            let record = FutureRecord::to(&topic)
                .key(key)
                .payload(&body)
                .headers(headers);
            let producer = self.producer();
            match producer.send(record, self.timeout).await {
                Ok(_) => Ok(None),
                Err((error, _)) if permanent(&error) => Err(SinkError::Permanent(format!(
                    "Kafka refused the record: {error}"
                ))),
                Err((error, _)) => {
                    self.renew_if_fatal(&producer);
                    Err(SinkError::Transient(format!(
                        "Kafka did not acknowledge it: {error}"
                    )))
                }
            }
        })
    }
}
