//! An optional duration, written like [`crate::duration`]'s.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub(crate) fn serialize<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(duration) => crate::duration::serialize(duration, serializer),
        None => serializer.serialize_none(),
    }
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    struct Wrapped(#[serde(with = "crate::duration")] Duration);
    Ok(Option::<Wrapped>::deserialize(deserializer)?.map(|Wrapped(d)| d))
}
