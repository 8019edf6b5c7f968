//! URLs as they may be shown: in logs, errors, metrics and admin answers.

/// `url` without its userinfo (`user:password@`), query and fragment, which is where
/// credentials travel (`?api_key=`, a Redis password). Several comma-separated URLs (a Redis
/// Cluster's nodes) are redacted one by one.
pub fn url(url: &str) -> String {
    url.split(',')
        .map(|one| one_url(one.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

fn one_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => (&url[..at + 3], &url[at + 3..]),
        None => ("", url),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let host = match authority.rfind('@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    format!("{scheme}{host}{path}")
}

/// An error with its causes, `outer: inner: innermost`: an HTTP client's "error sending
/// request" says nothing until its cause ("Connection refused") is named. Causes that repeat
/// the text before them are left out.
pub fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_query_and_fragment_are_removed() {
        assert_eq!(
            url("https://user:pa%40ss@hooks.example.com:8443/in/x?api_key=s3cret#frag"),
            "https://hooks.example.com:8443/in/x"
        );
        assert_eq!(
            url("redis://:hunter2@10.0.0.1:6379/0"),
            "redis://10.0.0.1:6379/0"
        );
        assert_eq!(
            url("redis://a:b@n1:7000, redis://n2:7001?password=x"),
            "redis://n1:7000,redis://n2:7001"
        );
        assert_eq!(url("http://plain/x"), "http://plain/x");
        assert_eq!(url("not a url @ all"), " all");
    }

    #[test]
    fn causes_are_named_once_each() {
        let inner =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let outer = std::io::Error::other(Wrapped(inner));
        assert_eq!(causes(&outer), "tcp connect error: Connection refused");
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("tcp connect error")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
