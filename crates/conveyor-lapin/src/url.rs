//! Broker URLs, and keeping their passwords out of logs and errors.

/// Kept here for `conveyor_lapin::redact_url`: the core's, shared by every transport.
pub use conveyor::kit::redact_url;

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
        match conveyor::kit::url_password(url).filter(|password| !password.is_empty()) {
            Some(password) => reason.replace(password, "***"),
            None => reason,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    /// The core's redaction (tested there), under the name this crate has always had.
    #[test]
    fn password_is_replaced() {
        assert_eq!(
            redact_url("amqps://u:p%40ss@host/vhost?heartbeat=10"),
            "amqps://u:***@host/vhost?heartbeat=10"
        );
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
}
