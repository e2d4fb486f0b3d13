//! The SQS transport's errors.

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// What can go wrong talking to SQS, each naming the queue it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// An SQS call failed; `call` names the API operation.
    #[error("SQS {call} on `{queue}` failed: {message}")]
    Call {
        /// The API operation (`ReceiveMessage`, `DeleteMessageBatch`, ...).
        call: &'static str,
        /// The queue name or URL.
        queue: String,
        /// The SDK's error with its context (never credentials).
        message: String,
    },
    /// The queue does not exist.
    #[error("SQS queue `{0}` does not exist")]
    NoSuchQueue(String),
    /// A message cannot be sent as it is; the text says why.
    #[error("cannot send to `{queue}`: {reason}")]
    InvalidMessage {
        /// The queue.
        queue: String,
        /// What is wrong with the message.
        reason: String,
    },
    /// Some entries of a batch call failed.
    #[error("SQS {call} on `{queue}`: {failed} of {total} entries failed: {first}")]
    BatchEntries {
        /// The API operation.
        call: &'static str,
        /// The queue.
        queue: String,
        /// How many entries failed.
        failed: usize,
        /// How many entries were sent.
        total: usize,
        /// The first failure's code and message.
        first: String,
    },
    /// The broker's settings cannot work; the text says why.
    #[error("invalid SQS configuration: {0}")]
    Config(String),
}

impl SqsError {
    /// An SDK error from `call` on `queue`, with the SDK's full context.
    pub(crate) fn call<E, R>(call: &'static str, queue: &str, error: SdkError<E, R>) -> Self
    where
        E: std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        SqsError::Call {
            call,
            queue: queue.to_string(),
            message: DisplayErrorContext(&error).to_string(),
        }
    }
}

/// Whether a failed call can never succeed by trying again: the queue is gone, access is
/// denied, the credentials are refused, or SQS refused the request itself (any other 4xx
/// but throttling and timeouts). Timeouts, connection failures, 5xx and throttling may
/// heal, and so may anything this transport does not recognise.
pub(crate) fn cannot_heal<E>(error: &SdkError<E, HttpResponse>) -> bool
where
    E: ProvideErrorMetadata,
{
    match error {
        SdkError::ServiceError(context) => {
            refused_for_good(context.raw().status().as_u16(), context.err().code())
        }
        _ => false,
    }
}

/// Error codes that heal with time (throttling, expiring credentials a provider renews,
/// SQS's own trouble), whatever their HTTP status.
const TRANSIENT_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "SlowDown",
    "OverLimit",
    "KmsThrottled",
    "RequestTimeout",
    "RequestTimeoutException",
    "RequestExpired",
    "ExpiredToken",
    "ExpiredTokenException",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
];

/// Error codes that never heal by retrying, whatever their HTTP status.
const PERMANENT_CODES: &[&str] = &[
    "QueueDoesNotExist",
    "AWS.SimpleQueueService.NonExistentQueue",
    "AccessDenied",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "MissingAuthenticationToken",
    "InvalidSecurity",
    "InvalidAddress",
    "KmsAccessDenied",
    "KmsDisabled",
    "KmsNotFound",
    "KmsInvalidState",
    "KmsInvalidKeyUsage",
    "KmsOptInRequired",
];

fn refused_for_good(status: u16, code: Option<&str>) -> bool {
    let code = code.unwrap_or_default();
    if TRANSIENT_CODES.contains(&code) {
        return false;
    }
    PERMANENT_CODES.contains(&code)
        || ((400..500).contains(&status) && !matches!(status, 408 | 429))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_queue_and_refused_access_cannot_heal() {
        assert!(refused_for_good(
            400,
            Some("AWS.SimpleQueueService.NonExistentQueue")
        ));
        assert!(refused_for_good(400, Some("QueueDoesNotExist")));
        assert!(refused_for_good(403, Some("AccessDenied")));
        assert!(refused_for_good(403, Some("InvalidClientTokenId")));
        assert!(refused_for_good(400, Some("KmsAccessDenied")));
        assert!(refused_for_good(400, Some("InvalidParameterValue")));
    }

    #[test]
    fn throttling_timeouts_and_server_errors_heal() {
        assert!(!refused_for_good(400, Some("ThrottlingException")));
        assert!(!refused_for_good(400, Some("RequestThrottled")));
        assert!(!refused_for_good(403, Some("OverLimit")));
        assert!(!refused_for_good(400, Some("KmsThrottled")));
        assert!(!refused_for_good(429, None));
        assert!(!refused_for_good(408, None));
        assert!(!refused_for_good(500, Some("InternalError")));
        assert!(!refused_for_good(503, None));
        assert!(!refused_for_good(502, Some("SomethingNew")));
    }
}
