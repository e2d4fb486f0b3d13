//! Broker URLs, and keeping their passwords out of logs and errors.

/// `url` with the password, if any, replaced by `***`: safe to log.
///
/// ```
/// use conveyor_lapin::redact_url;
///
/// assert_eq!(redact_url("amqp://app:s3cret@rabbit:5672/prod"), "amqp://app:***@rabbit:5672/prod");
/// assert_eq!(redact_url("amqp://127.0.0.1:5672"), "amqp://127.0.0.1:5672");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_string();
    };
    format!(
        "{}{}:***{}",
        &url[..scheme_end + 3],
        &userinfo[..colon],
        &rest[at..]
    )
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
    fn urls_without_password_are_unchanged() {
        assert_eq!(redact_url("amqp://guest@h"), "amqp://guest@h");
        assert_eq!(redact_url("amqp://h/a@b"), "amqp://h/a@b");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
