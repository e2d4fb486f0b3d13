//! Queues: what the transport learns about one when it resolves it.

use std::collections::HashMap;

use aws_sdk_sqs::types::QueueAttributeName;

/// What the transport knows about a queue, resolved once per name or URL.
#[derive(Clone, Debug)]
pub(crate) struct QueueInfo {
    /// The queue's name, for logs and errors.
    pub(crate) name: String,
    /// The queue's URL, for API calls.
    pub(crate) url: String,
    /// The queue's ARN, which a redrive policy names its dead-letter queue by.
    pub(crate) arn: Option<String>,
    /// Whether it is a FIFO queue.
    pub(crate) fifo: bool,
    /// Whether SQS deduplicates its messages by content.
    pub(crate) content_based_deduplication: bool,
    /// Where its redrive policy dead-letters its messages.
    pub(crate) dead_letter: DeadLetter,
    /// The largest message it accepts, in bytes.
    pub(crate) max_message_size: usize,
}

/// A queue's dead-letter queue, as its redrive policy names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DeadLetter {
    /// No redrive policy: a rejected message is deleted.
    None,
    /// The policy's target queue.
    Target(DeadLetterTarget),
    /// A redrive policy this transport cannot read (the text is kept for the error).
    Unreadable(String),
}

/// The dead-letter queue a redrive policy names by ARN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeadLetterTarget {
    /// The ARN, for logs.
    pub(crate) arn: String,
    /// The queue's name.
    pub(crate) name: String,
    /// The AWS account that owns it.
    pub(crate) account: String,
}

impl DeadLetter {
    /// Reads a `RedrivePolicy` attribute:
    /// `{"deadLetterTargetArn":"arn:aws:sqs:REGION:ACCOUNT:NAME","maxReceiveCount":5}`.
    pub(crate) fn from_policy(policy: &str) -> DeadLetter {
        let arn = serde_json::from_str::<serde_json::Value>(policy)
            .ok()
            .and_then(|v| v.get("deadLetterTargetArn")?.as_str().map(str::to_string));
        let Some(arn) = arn else {
            return DeadLetter::Unreadable(policy.to_string());
        };
        // arn:PARTITION:sqs:REGION:ACCOUNT:NAME
        let parts: Vec<&str> = arn.split(':').collect();
        match parts.as_slice() {
            ["arn", _, "sqs", _, account, name] if !account.is_empty() && !name.is_empty() => {
                DeadLetter::Target(DeadLetterTarget {
                    name: (*name).to_string(),
                    account: (*account).to_string(),
                    arn: arn.clone(),
                })
            }
            _ => DeadLetter::Unreadable(policy.to_string()),
        }
    }
}

/// The SQS default for `MaximumMessageSize` (256 KiB).
const DEFAULT_MAX_MESSAGE_SIZE: usize = 262_144;

impl QueueInfo {
    pub(crate) fn from_attributes(
        url: String,
        attributes: &HashMap<QueueAttributeName, String>,
    ) -> Self {
        let name = url.rsplit('/').next().unwrap_or(&url).to_string();
        let flag = |attribute| attributes.get(&attribute).is_some_and(|v| v == "true");
        QueueInfo {
            fifo: flag(QueueAttributeName::FifoQueue) || name.ends_with(".fifo"),
            content_based_deduplication: flag(QueueAttributeName::ContentBasedDeduplication),
            dead_letter: attributes
                .get(&QueueAttributeName::RedrivePolicy)
                .map_or(DeadLetter::None, |policy| DeadLetter::from_policy(policy)),
            arn: attributes.get(&QueueAttributeName::QueueArn).cloned(),
            max_message_size: attributes
                .get(&QueueAttributeName::MaximumMessageSize)
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_MAX_MESSAGE_SIZE),
            name,
            url,
        }
    }

    /// A queue for unit tests: standard, no dead-letter queue, 1 KiB messages.
    #[cfg(test)]
    pub(crate) fn for_tests(name: &str) -> QueueInfo {
        QueueInfo {
            name: name.into(),
            url: format!("http://127.0.0.1:4566/123456789012/{name}"),
            arn: Some(format!("arn:aws:sqs:us-east-1:123456789012:{name}")),
            fifo: name.ends_with(".fifo"),
            content_based_deduplication: false,
            dead_letter: DeadLetter::None,
            max_message_size: 1024,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_policy_names_its_dead_letter_queue_by_arn() {
        let policy = r#"{"deadLetterTargetArn":"arn:aws:sqs:eu-west-1:123456789012:orders-dead.fifo","maxReceiveCount":"5"}"#;
        assert_eq!(
            DeadLetter::from_policy(policy),
            DeadLetter::Target(DeadLetterTarget {
                arn: "arn:aws:sqs:eu-west-1:123456789012:orders-dead.fifo".into(),
                name: "orders-dead.fifo".into(),
                account: "123456789012".into(),
            })
        );
        assert!(matches!(
            DeadLetter::from_policy(r#"{"maxReceiveCount":5}"#),
            DeadLetter::Unreadable(_)
        ));
        assert!(matches!(
            DeadLetter::from_policy(r#"{"deadLetterTargetArn":"not-an-arn"}"#),
            DeadLetter::Unreadable(_)
        ));
    }
}
