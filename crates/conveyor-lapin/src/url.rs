//! Broker URLs, and keeping their passwords out of logs and errors.

/// `url` with the password, if any, replaced by `***`: safe to log.
///
/// A password should be percent-encoded, but people paste raw ones, with `/`, `?`, `#`,
/// `@` or `:` in them. So the user information is taken to end at the *last* `@` of the
/// URL, not at the first `/`: whatever could be a password is hidden, at the price of
/// hiding a little more than needed for the rare URL with an `@` in its path or query.
/// A URL mistyped with one slash after its scheme, or none, is redacted all the same.
///
/// ```
/// use conveyor_lapin::redact_url;
///
/// assert_eq!(redact_url("amqp://app:s3cret@rabbit:5672/prod"), "amqp://app:***@rabbit:5672/prod");
/// assert_eq!(redact_url("amqp://app:ab/cd@rabbit/prod"), "amqp://app:***@rabbit/prod");
/// assert_eq!(redact_url("amqp:/app:s3cret@rabbit/prod"), "amqp:/app:***@rabbit/prod");
/// assert_eq!(redact_url("amqp://127.0.0.1:5672"), "amqp://127.0.0.1:5672");
/// ```
pub fn redact_url(url: &str) -> String {
    match password_range(url) {
        Some(range) => format!("{}***{}", &url[..range.start], &url[range.end..]),
        None => url.to_string(),
    }
}

/// Parses a broker URL, which must start with `amqp://` or `amqps://`; the error says
/// why not, with no part of the password in it.
///
/// lapin's parser takes `amqp:/user:password@host/vhost` for the default host with the
/// vhost `user:password@host/vhost`, which the broker would then name in its refusal.
pub(crate) fn parse(url: &str) -> Result<lapin::uri::AMQPUri, String> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !scheme.is_some_and(|scheme| {
        scheme.eq_ignore_ascii_case("amqp") || scheme.eq_ignore_ascii_case("amqps")
    }) {
        return Err("it must start with amqp:// or amqps://".into());
    }
    url.parse().map_err(|reason: String| {
        let reason = reason.replace(url, &redact_url(url));
        match password(url).filter(|password| !password.is_empty()) {
            Some(password) => reason.replace(password, "***"),
            None => reason,
        }
    })
}

/// `url`'s password as written, if it has one.
fn password(url: &str) -> Option<&str> {
    password_range(url).map(|range| &url[range])
}

/// Where `url`'s password is: from the colon after the user name to the last `@`.
fn password_range(url: &str) -> Option<std::ops::Range<usize>> {
    let start = authority_start(url);
    let authority = &url[start..];
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    Some(start + colon + 1..start + at)
}

/// Where the user information starts: after the scheme and its slashes, however many.
/// A prefix counts as a scheme only if slashes follow it or it is `amqp`/`amqps`, so
/// that in `user:password@host` the user is not taken for a scheme.
fn authority_start(url: &str) -> usize {
    let Some(colon) = url.find(':') else {
        return 0;
    };
    let scheme = &url[..colon];
    let well_formed = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let after = &url[colon + 1..];
    let slashes = after.len() - after.trim_start_matches('/').len();
    let amqp = scheme.eq_ignore_ascii_case("amqp") || scheme.eq_ignore_ascii_case("amqps");
    if well_formed && (slashes > 0 || amqp) {
        colon + 1 + slashes
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn password_is_replaced() {
        assert_eq!(
            redact_url("amqps://u:p%40ss@host/vhost?heartbeat=10"),
            "amqps://u:***@host/vhost?heartbeat=10"
        );
    }

    #[test]
    fn raw_passwords_with_url_delimiters_never_show() {
        for password in [
            "ab/cd",
            "a?b",
            "a#b",
            "p@ss",
            "a:b",
            "x/y@z?w#v:u",
            "p%2Fq%40r",
        ] {
            let url = format!("amqp://app:{password}@rabbit:5672/prod?heartbeat=10");
            let redacted = redact_url(&url);
            assert_eq!(redacted, "amqp://app:***@rabbit:5672/prod?heartbeat=10");
            assert!(!redacted.contains(password), "{redacted}");
        }
    }

    #[test]
    fn passwords_of_urls_mistyped_without_both_slashes_never_show() {
        for (url, redacted) in [
            ("amqp:/app:s3cret@h/prod", "amqp:/app:***@h/prod"),
            ("amqp:app:s3cret@h/prod", "amqp:app:***@h/prod"),
            ("AMQPS:app:s3cret@h", "AMQPS:app:***@h"),
            ("amqp:///app:s3cret@h", "amqp:///app:***@h"),
            ("app:s3cret@h:5672", "app:***@h:5672"),
            ("app:s3:cret@h", "app:***@h"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
    }

    #[test]
    fn a_url_that_does_not_parse_is_refused_without_its_password() {
        for url in [
            "amqp:/app:s3cret@h/prod",
            "amqp:app:s3cret@h/prod",
            "rabbit://app:s3cret@h",
            "amqp://app:s3cret@h:port/prod",
            "amqp://app:s3cret@h:99999/prod",
            "amqp://app:s3cret@h/prod?heartbeat=x",
        ] {
            let Err(reason) = super::parse(url) else {
                panic!("{url} parsed");
            };
            assert!(!reason.contains("s3cret"), "{url}: {reason}");
        }
        assert!(super::parse("AMQPS://app:s3cret@h/prod").is_ok());
    }

    #[test]
    fn urls_without_password_are_unchanged() {
        assert_eq!(redact_url("amqp://guest@h"), "amqp://guest@h");
        assert_eq!(redact_url("amqp://h/a@b"), "amqp://h/a@b");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("rabbit:5672"), "rabbit:5672");
        assert_eq!(super::password("amqp://guest@h"), None);
    }
}
