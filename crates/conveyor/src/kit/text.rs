//! Texts a transport puts in logs and errors: names quoted boundedly, URLs without
//! their password, and ids no one else makes.

/// An id no other call in this process returns, nor (by its clock) any call in another
/// process: the clock in nanoseconds, the process id and a count, in hex, joined by `-`.
/// For deduplication ids, correlation prefixes and the like.
///
/// ```
/// let (a, b) = (conveyor::kit::unique_id(), conveyor::kit::unique_id());
/// assert_ne!(a, b);
/// ```
pub fn unique_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};

    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{count:x}", std::process::id())
}

/// `name` as an error text quotes it: whole up to `max_chars` characters, else its first
/// `max_chars` and `…`, cut at a character boundary, so that a megabyte-long name does not
/// make a megabyte-long error. Control characters are escaped, so the name stays on its
/// line. Borrows when there is nothing to change.
///
/// ```
/// assert_eq!(conveyor::kit::bounded("orders", 64), "orders");
/// assert_eq!(conveyor::kit::bounded("abcdef", 3), "abc…");
/// assert_eq!(conveyor::kit::bounded("a\nb", 64), "a\\nb");
/// ```
pub fn bounded(name: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    let cut = name.char_indices().nth(max_chars).map(|(end, _)| end);
    let kept = name.get(..cut.unwrap_or(name.len())).unwrap_or(name);
    if cut.is_none() && !kept.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut text = String::with_capacity(kept.len().saturating_add(3));
    for c in kept.chars() {
        if c.is_control() {
            text.extend(c.escape_debug());
        } else {
            text.push(c);
        }
    }
    if cut.is_some() {
        text.push('…');
    }
    std::borrow::Cow::Owned(text)
}

/// `url` with the password, if any, replaced by `***`: safe to log, or to quote in an
/// error.
///
/// A password should be percent-encoded, but people paste raw ones, with `/`, `?`, `#`,
/// `@` or `:` in them. So the user information is taken to end at the *last* `@` of the
/// URL, not at the first `/`: whatever could be a password is hidden, at the price of
/// hiding a little more than needed for the rare URL with an `@` in its path or query.
/// A URL mistyped with one slash after its scheme, or none, is redacted all the same (a
/// prefix followed by no slash counts as a scheme only if it is one of the transports'
/// own, `amqp`, `amqps`, `http` or `https`, so that in `user:password@host` the user is
/// not taken for one).
///
/// ```
/// use conveyor::kit::redact_url;
///
/// assert_eq!(redact_url("amqp://app:s3cret@rabbit:5672/prod"), "amqp://app:***@rabbit:5672/prod");
/// assert_eq!(redact_url("https://app:ab/cd@gw.example/q"), "https://app:***@gw.example/q");
/// assert_eq!(redact_url("amqp:/app:s3cret@rabbit/prod"), "amqp:/app:***@rabbit/prod");
/// assert_eq!(redact_url("http://127.0.0.1:4566/123/q"), "http://127.0.0.1:4566/123/q");
/// ```
pub fn redact_url(url: &str) -> String {
    match url_password_range(url) {
        Some(range) => format!(
            "{}***{}",
            url.get(..range.start).unwrap_or_default(),
            url.get(range.end..).unwrap_or_default()
        ),
        None => url.to_string(),
    }
}

/// `text` with `url`'s password replaced by `***` wherever it appears: for a client's
/// error, which may quote the URL it was given.
///
/// ```
/// use conveyor::kit::without_password;
///
/// let error = "cannot reach redis://app:s3cret@cache:6379";
/// assert_eq!(
///     without_password(error, "redis://app:s3cret@cache:6379"),
///     "cannot reach redis://app:***@cache:6379"
/// );
/// ```
pub fn without_password(text: &str, url: &str) -> String {
    match url_password(url) {
        Some(password) if !password.is_empty() => text.replace(password, "***"),
        _ => text.to_string(),
    }
}

/// `url`'s password as written (what [`redact_url`] hides), if it has one: for a
/// transport that must also hide it where a library quotes it in its own words.
///
/// ```
/// use conveyor::kit::url_password;
///
/// assert_eq!(url_password("amqp://app:s3cret@rabbit/prod"), Some("s3cret"));
/// assert_eq!(url_password("amqp://guest@rabbit"), None);
/// ```
pub fn url_password(url: &str) -> Option<&str> {
    url_password_range(url).and_then(|range| url.get(range))
}

/// Where `url`'s password is: from the colon after the user name to the last `@`.
fn url_password_range(url: &str) -> Option<std::ops::Range<usize>> {
    let start = authority_start(url);
    let authority = url.get(start..)?;
    let at = authority.rfind('@')?;
    let colon = authority.get(..at)?.find(':')?;
    Some(start + colon + 1..start + at)
}

/// Where a URL's user information starts: after the scheme and its slashes, however
/// many. A prefix counts as a scheme only if slashes follow it or it is one of the
/// transports' own, so that in `user:password@host` the user is not taken for a scheme.
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
    let known = ["amqp", "amqps", "http", "https"]
        .iter()
        .any(|known| scheme.eq_ignore_ascii_case(known));
    if well_formed && (slashes > 0 || known) {
        colon + 1 + slashes
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_password_is_replaced() {
        assert_eq!(
            redact_url("amqps://u:p%40ss@host/vhost?heartbeat=10"),
            "amqps://u:***@host/vhost?heartbeat=10"
        );
        assert_eq!(
            redact_url("http://svc:s3cr3t-pw@127.0.0.1:1/123456789012/q"),
            "http://svc:***@127.0.0.1:1/123456789012/q"
        );
    }

    #[test]
    fn raw_url_passwords_with_url_delimiters_never_show() {
        for password in [
            "ab/cd",
            "a?b",
            "a#b",
            "p@ss",
            "a:b",
            "x/y@z?w#v:u",
            "p%2Fq%40r",
        ] {
            for scheme in ["amqp", "https"] {
                let url = format!("{scheme}://app:{password}@host:5672/prod?heartbeat=10");
                let redacted = redact_url(&url);
                assert_eq!(
                    redacted,
                    format!("{scheme}://app:***@host:5672/prod?heartbeat=10")
                );
                assert!(!redacted.contains(password), "{redacted}");
                assert_eq!(url_password(&url), Some(password));
            }
        }
    }

    #[test]
    fn passwords_of_urls_mistyped_without_both_slashes_never_show() {
        for (url, redacted) in [
            ("amqp:/app:s3cret@h/prod", "amqp:/app:***@h/prod"),
            ("amqp:app:s3cret@h/prod", "amqp:app:***@h/prod"),
            ("AMQPS:app:s3cret@h", "AMQPS:app:***@h"),
            ("amqp:///app:s3cret@h", "amqp:///app:***@h"),
            ("http:app:s3cret@h/q", "http:app:***@h/q"),
            ("app:s3cret@h:5672", "app:***@h:5672"),
            ("app:s3:cret@h", "app:***@h"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
    }

    #[test]
    fn urls_without_a_password_are_unchanged() {
        for url in [
            "amqp://guest@h",
            "amqp://h/a@b",
            "not a url",
            "rabbit:5672",
            "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
            "orders",
        ] {
            assert_eq!(redact_url(url), url);
            assert_eq!(url_password(url), None, "{url}");
        }
    }
}
