//! The callback's query string: the platforms put the signature, timestamp, nonce and `echostr`
//! there, percent-encoded. A `+` stays a `+` (base64 has them; the platforms encode them as
//! `%2B`, and a raw one is not a space here).

use percent_encoding::percent_decode_str;

/// The decoded parameters of a query string.
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    /// Parses `query` (without `?`); a parameter that does not decode to UTF-8 is dropped.
    pub(crate) fn parse(query: Option<&str>) -> Self {
        let decode = |text: &str| percent_decode_str(text).decode_utf8().ok().map(Into::into);
        Self(
            query
                .unwrap_or_default()
                .split('&')
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| {
                    let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                    Some((decode(name)?, decode(value)?))
                })
                .collect(),
        )
    }

    /// The first value of `name`, if it is there and not empty.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(at, _)| at == name)
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_keeps_plus_signs() {
        let query = Query::parse(Some(
            "msg_signature=5c45&timestamp=1409659589&nonce=263014780&echostr=P9nAzCzyDtyTWESHep1vC5X9xho%2FqYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp%2B4RPcs8TgAE7OaBO%2BFZXvnaqQ%3D%3D&x=a+b&empty=&bad=%FF",
        ));
        assert_eq!(
            query.get("echostr"),
            Some(
                "P9nAzCzyDtyTWESHep1vC5X9xho/qYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp+4RPcs8TgAE7OaBO+FZXvnaqQ=="
            )
        );
        assert_eq!(query.get("x"), Some("a+b"));
        assert_eq!(query.get("empty"), None);
        assert_eq!(query.get("bad"), None);
        assert_eq!(query.get("missing"), None);
        assert_eq!(Query::parse(None).get("nonce"), None);
    }
}
