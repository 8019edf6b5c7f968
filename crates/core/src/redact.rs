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
}
