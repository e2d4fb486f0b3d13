//! SQS's own settings on the portable [`QueueSpec`], and how a spec becomes the attributes
//! of an SQS queue.

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use conveyor::{DeadLetterPolicy, Error, QueueSpec};

use crate::broker::is_url;
use crate::error::shown;
use crate::settle::whole_seconds_up;

/// The longest visibility timeout SQS takes on a queue (12 hours).
const MAX_VISIBILITY_SECONDS: u64 = 43_200;

/// The longest delivery delay SQS takes on a queue (15 minutes).
const MAX_DELAY_SECONDS: u64 = 900;

/// The range of a redrive policy's `maxReceiveCount`.
const MAX_RECEIVE_COUNTS: std::ops::RangeInclusive<u32> = 1..=1000;

/// The longest queue name SQS takes, `.fifo` included.
const MAX_NAME_LENGTH: usize = 80;

/// SQS settings on a [`conveyor::QueueSpec`], beyond the portable ones every transport
/// shares. Import it to call them on a spec:
///
/// ```
/// use std::time::Duration;
/// use aws_sdk_sqs::types::QueueAttributeName;
/// use conveyor::QueueSpec;
/// use conveyor_sqs::SqsQueueSpec;
///
/// let orders = QueueSpec::new("orders.fifo")
///     .dead_letter_queue("orders-dead.fifo", 5)
///     .visibility_timeout(Duration::from_secs(60))
///     .content_based_deduplication()
///     .attribute(QueueAttributeName::MessageRetentionPeriod, "1209600");
/// assert!(orders.is_fifo());
/// ```
///
/// How [`Broker::declare_queue`](conveyor::Broker::declare_queue) maps a spec onto SQS: a
/// name ending in `.fifo` sets `FifoQueue`; [`dead_letter_queue`](QueueSpec::dead_letter_queue)
/// sets a `RedrivePolicy` naming that queue's ARN (the queue must exist, and be FIFO
/// exactly when this one is); [`visibility_timeout`](QueueSpec::visibility_timeout) sets
/// `VisibilityTimeout` and [`delay`](QueueSpec::delay) `DelaySeconds`, both rounded up to
/// whole seconds. A visibility timeout over 12 hours, a delay over 15 minutes, a max
/// receive count outside 1..=1000, or a name SQS refuses is [`Error::Config`], before any
/// call. The attributes given here are set last, so one of them replaces what the portable
/// settings set.
///
/// This trait is sealed: only [`QueueSpec`] implements it.
pub trait SqsQueueSpec: sealed::Sealed + Sized {
    /// FIFO queues only: SQS deduplicates messages by a hash of their body, so a publisher
    /// needs no message id to publish once. On a standard queue, declaring the spec is
    /// [`Error::Config`].
    #[must_use]
    fn content_based_deduplication(self) -> Self;

    /// Any other queue attribute, as SQS spells it (retention, maximum message size,
    /// encryption, a redrive allow policy, ...), replacing one of the same name given
    /// before. SQS checks the value when the queue is declared.
    #[must_use]
    fn attribute(self, name: QueueAttributeName, value: impl Into<String>) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for conveyor::QueueSpec {}
}

/// What [`SqsQueueSpec`] adds to a spec, kept as one of its extensions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SqsExtras {
    content_based_deduplication: bool,
    attributes: Vec<(QueueAttributeName, String)>,
}

impl SqsQueueSpec for QueueSpec {
    fn content_based_deduplication(self) -> Self {
        let mut extras = extras(&self);
        extras.content_based_deduplication = true;
        self.with_extension(extras)
    }

    fn attribute(self, name: QueueAttributeName, value: impl Into<String>) -> Self {
        let mut extras = extras(&self);
        extras.attributes.retain(|(known, _)| *known != name);
        extras.attributes.push((name, value.into()));
        self.with_extension(extras)
    }
}

fn extras(spec: &QueueSpec) -> SqsExtras {
    spec.extension::<SqsExtras>().cloned().unwrap_or_default()
}

/// A spec checked against SQS's limits: the attributes to declare the queue with, once the
/// dead-letter queue's ARN is known.
#[derive(Debug)]
pub(crate) struct Declaration {
    /// Every attribute but the redrive policy.
    portable: Vec<(QueueAttributeName, String)>,
    /// The dead-letter queue and max receive count, if any.
    pub(crate) dead_letter: Option<DeadLetterPolicy>,
    /// The attributes given with [`SqsQueueSpec::attribute`], set last.
    extra: Vec<(QueueAttributeName, String)>,
}

impl Declaration {
    /// Checks `spec` against what SQS takes; refuses, with [`Error::Config`], what SQS
    /// would refuse or what would not mean what it says (a delay that is rounded down).
    pub(crate) fn check(spec: &QueueSpec) -> Result<Declaration, Error> {
        let name = spec.name();
        let bad = |what: String| Error::config(format!("SQS queue `{}`: {what}", shown(name)));
        check_name(name).map_err(|problem| {
            if is_url(name) {
                bad(format!("{problem}; declare queues by name, not URL"))
            } else {
                bad(problem)
            }
        })?;
        let extras = extras(spec);
        let mut portable = Vec::new();
        if spec.is_fifo() {
            portable.push((QueueAttributeName::FifoQueue, "true".to_string()));
        }
        if extras.content_based_deduplication {
            if !spec.is_fifo() {
                return Err(bad(
                    "content-based deduplication is for FIFO queues (named `*.fifo`) only".into(),
                ));
            }
            portable.push((
                QueueAttributeName::ContentBasedDeduplication,
                "true".to_string(),
            ));
        }
        if let Some(timeout) = spec.visibility() {
            let seconds = seconds_up_to(timeout, MAX_VISIBILITY_SECONDS).ok_or_else(|| {
                bad(format!(
                    "a visibility timeout of {timeout:?} is over SQS's {MAX_VISIBILITY_SECONDS} s (12 h)"
                ))
            })?;
            portable.push((QueueAttributeName::VisibilityTimeout, seconds.to_string()));
        }
        if let Some(delay) = spec.delivery_delay() {
            let seconds = seconds_up_to(delay, MAX_DELAY_SECONDS).ok_or_else(|| {
                bad(format!(
                    "a delay of {delay:?} is over SQS's {MAX_DELAY_SECONDS} s (15 min)"
                ))
            })?;
            portable.push((QueueAttributeName::DelaySeconds, seconds.to_string()));
        }
        if let Some(policy) = spec.dead_letter() {
            if !MAX_RECEIVE_COUNTS.contains(&policy.max_receive_count) {
                return Err(bad(format!(
                    "a max receive count of {} is outside SQS's {} to {}",
                    policy.max_receive_count,
                    MAX_RECEIVE_COUNTS.start(),
                    MAX_RECEIVE_COUNTS.end()
                )));
            }
            // SQS demands it, and says so less clearly: a FIFO queue's dead letters keep
            // their group only in a FIFO queue, and a standard queue's have none to give.
            let dead_fifo = policy.queue.ends_with(".fifo");
            if dead_fifo != spec.is_fifo() {
                let kind = |fifo| if fifo { "a FIFO" } else { "a standard" };
                return Err(bad(format!(
                    "its dead-letter queue `{}` is {} queue, and SQS takes only {} one here",
                    shown(&policy.queue),
                    kind(dead_fifo),
                    kind(spec.is_fifo())
                )));
            }
        }
        Ok(Declaration {
            portable,
            dead_letter: spec.dead_letter().cloned(),
            extra: extras.attributes,
        })
    }

    /// The queue's attributes, with a redrive policy naming `dead_letter_arn` where the
    /// spec has a dead-letter queue.
    pub(crate) fn attributes(
        self,
        dead_letter_arn: Option<&str>,
    ) -> Vec<(QueueAttributeName, String)> {
        let mut attributes = self.portable;
        if let (Some(policy), Some(arn)) = (&self.dead_letter, dead_letter_arn) {
            let redrive = serde_json::json!({
                "deadLetterTargetArn": arn,
                "maxReceiveCount": policy.max_receive_count,
            });
            attributes.push((QueueAttributeName::RedrivePolicy, redrive.to_string()));
        }
        for (name, value) in self.extra {
            attributes.retain(|(known, _)| *known != name);
            attributes.push((name, value));
        }
        attributes
    }
}

/// `duration` in whole seconds, rounded up (SQS counts in seconds, and a hold or a delay
/// must never be shorter than asked), if that is at most `max`.
fn seconds_up_to(duration: Duration, max: u64) -> Option<u64> {
    Some(whole_seconds_up(duration)).filter(|seconds| *seconds <= max)
}

/// SQS's rules for a queue name: 1 to 80 characters of letters, digits, `-` and `_`, the
/// `.fifo` suffix included.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if stem.is_empty() || name.len() > MAX_NAME_LENGTH {
        return Err(format!(
            "a queue name has 1 to {MAX_NAME_LENGTH} characters, `.fifo` included"
        ));
    }
    if !stem
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
    {
        return Err(
            "a queue name has only letters, digits, `-` and `_` (and `.fifo` at its end)".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(spec: &QueueSpec) -> Vec<(QueueAttributeName, String)> {
        Declaration::check(spec)
            .expect("a valid spec")
            .attributes(Some("arn:aws:sqs:us-east-1:123456789012:dead"))
    }

    fn refused(spec: &QueueSpec) -> String {
        match Declaration::check(spec) {
            Err(Error::Config(message)) => message,
            other => panic!("{spec:?} should be a configuration error: {other:?}"),
        }
    }

    fn value(
        attributes: &[(QueueAttributeName, String)],
        name: QueueAttributeName,
    ) -> Option<&str> {
        attributes
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, value)| value.as_str())
    }

    #[test]
    fn the_portable_settings_become_sqs_attributes() {
        let spec = QueueSpec::new("orders.fifo")
            .dead_letter_queue("dead.fifo", 5)
            .visibility_timeout(Duration::from_secs(60))
            .delay(Duration::from_secs(3));
        let declared = Declaration::check(&spec)
            .expect("valid")
            .attributes(Some("arn:aws:sqs:us-east-1:123456789012:dead.fifo"));
        assert_eq!(
            value(&declared, QueueAttributeName::FifoQueue),
            Some("true")
        );
        assert_eq!(
            value(&declared, QueueAttributeName::VisibilityTimeout),
            Some("60")
        );
        assert_eq!(
            value(&declared, QueueAttributeName::DelaySeconds),
            Some("3")
        );
        let policy: serde_json::Value = serde_json::from_str(
            value(&declared, QueueAttributeName::RedrivePolicy).expect("a redrive policy"),
        )
        .expect("JSON");
        assert_eq!(
            policy,
            serde_json::json!({
                "deadLetterTargetArn": "arn:aws:sqs:us-east-1:123456789012:dead.fifo",
                "maxReceiveCount": 5,
            })
        );
        assert_eq!(
            value(&declared, QueueAttributeName::ContentBasedDeduplication),
            None
        );
    }

    #[test]
    fn a_standard_queue_sets_no_fifo_attribute_and_unset_settings_set_nothing() {
        assert!(attributes(&QueueSpec::new("plain")).is_empty());
    }

    #[test]
    fn visibility_and_delay_round_up_to_whole_seconds() {
        let declared = attributes(
            &QueueSpec::new("q")
                .visibility_timeout(Duration::from_millis(1500))
                .delay(Duration::from_millis(300)),
        );
        assert_eq!(
            value(&declared, QueueAttributeName::VisibilityTimeout),
            Some("2")
        );
        assert_eq!(
            value(&declared, QueueAttributeName::DelaySeconds),
            Some("1")
        );
    }

    #[test]
    fn the_limits_themselves_are_taken() {
        let declared = attributes(
            &QueueSpec::new("q")
                .visibility_timeout(Duration::from_secs(43_200))
                .delay(Duration::from_secs(900))
                .dead_letter_queue("dead", 1000),
        );
        assert_eq!(
            value(&declared, QueueAttributeName::VisibilityTimeout),
            Some("43200")
        );
        assert_eq!(
            value(&declared, QueueAttributeName::DelaySeconds),
            Some("900")
        );
        assert!(value(&declared, QueueAttributeName::RedrivePolicy).is_some());
    }

    #[test]
    fn a_visibility_timeout_over_twelve_hours_is_a_configuration_error() {
        let message =
            refused(&QueueSpec::new("q").visibility_timeout(Duration::from_millis(43_200_001)));
        assert!(
            message.contains("visibility timeout") && message.contains("`q`"),
            "{message}"
        );
    }

    #[test]
    fn a_delay_over_fifteen_minutes_is_a_configuration_error() {
        let message = refused(&QueueSpec::new("q").delay(Duration::from_millis(900_001)));
        assert!(message.contains("delay"), "{message}");
    }

    #[test]
    fn a_max_receive_count_outside_one_to_a_thousand_is_a_configuration_error() {
        for count in [0, 1001] {
            let message = refused(&QueueSpec::new("q").dead_letter_queue("dead", count));
            assert!(message.contains("max receive count"), "{message}");
        }
    }

    #[test]
    fn a_dead_letter_queue_of_the_other_kind_is_a_configuration_error() {
        refused(&QueueSpec::new("q.fifo").dead_letter_queue("dead", 5));
        refused(&QueueSpec::new("q").dead_letter_queue("dead.fifo", 5));
    }

    #[test]
    fn content_based_deduplication_is_for_fifo_queues_only() {
        let declared = attributes(&QueueSpec::new("q.fifo").content_based_deduplication());
        assert_eq!(
            value(&declared, QueueAttributeName::ContentBasedDeduplication),
            Some("true")
        );
        let message = refused(&QueueSpec::new("q").content_based_deduplication());
        assert!(message.contains("FIFO"), "{message}");
    }

    #[test]
    fn names_sqs_refuses_are_configuration_errors() {
        for name in [
            "",
            ".fifo",
            "has space",
            "dotted.name",
            "http://127.0.0.1:4566/123456789012/q",
            &"x".repeat(81),
            &format!("{}.fifo", "x".repeat(76)),
        ] {
            refused(&QueueSpec::new(name));
        }
        for name in [
            "a",
            "A-b_9",
            &"x".repeat(80),
            &format!("{}.fifo", "x".repeat(75)),
        ] {
            assert!(Declaration::check(&QueueSpec::new(name)).is_ok(), "{name}");
        }
    }

    #[test]
    fn extra_attributes_come_last_and_replace_the_portable_ones() {
        let spec = QueueSpec::new("q")
            .visibility_timeout(Duration::from_secs(60))
            .attribute(QueueAttributeName::MessageRetentionPeriod, "60")
            .attribute(QueueAttributeName::VisibilityTimeout, "7")
            .attribute(QueueAttributeName::MessageRetentionPeriod, "120");
        let declared = attributes(&spec);
        assert_eq!(
            declared,
            vec![
                (QueueAttributeName::VisibilityTimeout, "7".to_string()),
                (
                    QueueAttributeName::MessageRetentionPeriod,
                    "120".to_string()
                ),
            ]
        );
    }

    #[test]
    fn sqs_settings_are_one_extension_of_the_portable_spec() {
        let spec = QueueSpec::new("q.fifo")
            .content_based_deduplication()
            .attribute(QueueAttributeName::MaximumMessageSize, "1024");
        assert_eq!(
            spec.extension::<SqsExtras>(),
            Some(&SqsExtras {
                content_based_deduplication: true,
                attributes: vec![(QueueAttributeName::MaximumMessageSize, "1024".into())],
            })
        );
    }
}
