//! Broker URLs, and keeping their passwords out of logs and errors.

/// `url` with the password, if any, replaced by `***`: safe to log.
///
/// A password should be percent-encoded, but people paste raw ones, with `/`, `?`, `#`,
/// `@` or `:` in them. So the user information is taken to end at the *last* `@` of the
/// URL, not at the first `/`: whatever could be a password is hidden, at the price of
/// hiding a little more than needed for the rare URL with an `@` in its path or query.
///
/// ```
/// use conveyor_lapin::redact_url;
///
/// assert_eq!(redact_url("amqp://app:s3cret@rabbit:5672/prod"), "amqp://app:***@rabbit:5672/prod");
/// assert_eq!(redact_url("amqp://app:ab/cd@rabbit/prod"), "amqp://app:***@rabbit/prod");
/// assert_eq!(redact_url("amqp://127.0.0.1:5672"), "amqp://127.0.0.1:5672");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_string();
    };
    format!("{scheme}{}:***{}", &userinfo[..colon], &rest[at..])
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
    fn urls_without_password_are_unchanged() {
        assert_eq!(redact_url("amqp://guest@h"), "amqp://guest@h");
        assert_eq!(redact_url("amqp://h/a@b"), "amqp://h/a@b");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
