//! Queue names: a queue is the subject of its name and the JetStream stream that takes
//! it. A subject may have dots (`orders.eu`) where a stream's name may not, so the
//! stream's name is the queue's with each `.` as `~`, which a queue name may not hold.

use crate::error::NatsError;

/// The longest queue name: JetStream stores a stream under a directory of its name.
pub(crate) const MAX_NAME: usize = 255;

/// Checks that `name` can be a queue's subject and, mapped, its stream's name.
pub(crate) fn check(name: &str) -> Result<(), NatsError> {
    let why = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME {
        Some("it is longer than 255 bytes")
    } else if name
        .chars()
        .any(|c| !c.is_ascii_graphic() || matches!(c, '*' | '>' | '/' | '\\' | '~'))
    {
        Some("a queue name is printable ASCII without `*`, `>`, `/`, `\\` or `~`")
    } else if name.split('.').any(str::is_empty) {
        Some("a dot must stand between two parts of the name")
    } else {
        None
    };
    match why {
        Some(why) => Err(NatsError::Name {
            name: conveyor::kit::bounded(name, 64).into_owned(),
            why,
        }),
        None => Ok(()),
    }
}

/// The name of the stream of queue `name`.
pub(crate) fn stream(name: &str) -> String {
    name.replace('.', "~")
}

/// Whether `destination` is a reply inbox (a plain NATS subject no stream takes), which
/// a reply is published to directly.
pub(crate) fn is_inbox(destination: &str) -> bool {
    destination.starts_with("_INBOX.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_subjects_without_wildcards_or_empty_parts() {
        for good in ["orders", "orders.fifo", "orders-eu_1.v2"] {
            assert!(check(good).is_ok(), "{good:?}");
        }
        for bad in [
            "", "a b", "a*", "a.>", "a/b", "a~b", "é", ".a", "a.", "a..b",
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        assert!(check(&"a".repeat(256)).is_err());
    }

    #[test]
    fn a_stream_is_named_after_its_queue_with_dots_as_tildes() {
        assert_eq!(stream("orders.fifo"), "orders~fifo");
        assert_eq!(stream("orders"), "orders");
    }

    #[test]
    fn reply_inboxes_are_told_apart_from_queues() {
        assert!(is_inbox("_INBOX.abc.1"));
        assert!(!is_inbox("orders"));
    }
}
