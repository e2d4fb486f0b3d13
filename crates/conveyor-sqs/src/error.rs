//! The SQS transport's errors.

use std::borrow::Cow;
use std::fmt;

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use conveyor::BoxError;

use crate::broker::is_url;

/// What can go wrong talking to SQS, each naming the queue it concerns.
///
/// An SDK error stays whole, as the [`source`](std::error::Error::source) of
/// [`SqsError::Call`], so it can be downcast (to `SdkError<CreateQueueError, HttpResponse>`,
/// say); `Display` shows this error alone, and [`conveyor::Report`] shows it with its
/// causes. The texts quote a queue name of at most 80 characters (SQS's longest) or a
/// queue URL of at most 200 whole, and only the start of a longer one, ending in `…`; the
/// fields keep it whole. Neither keeps the password of a queue URL that has one (user
/// information, for a gateway in front of SQS): it is `***`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// An SQS call failed; `call` names the API operation.
    #[error("SQS {call} on `{}` failed", shown(queue))]
    Call {
        /// The API operation (`ReceiveMessage`, `DeleteMessageBatch`, ...).
        call: &'static str,
        /// The queue name or URL.
        queue: String,
        /// The SDK's error (an `SdkError`), which carries no credentials.
        #[source]
        source: BoxError,
    },
    /// An SNS call failed (the `sns` feature); `call` names the API operation.
    #[error("SNS {call} on `{}` failed", shown(topic))]
    SnsCall {
        /// The API operation (`Publish`, `Subscribe`, ...).
        call: &'static str,
        /// The topic name or ARN.
        topic: String,
        /// The SDK's error (an `SdkError`), which carries no credentials.
        #[source]
        source: BoxError,
    },
    /// The queue does not exist.
    #[error("SQS queue `{}` does not exist", shown(queue))]
    NoSuchQueue {
        /// The queue name, URL or ARN.
        queue: String,
        /// SQS's answer that said so, where one did.
        #[source]
        source: Option<BoxError>,
    },
    /// A message cannot be sent as it is; the text says why, and only that: the
    /// [`conveyor::Error::Refused`] that carries it names the queue.
    #[error("{reason}")]
    InvalidMessage {
        /// The queue.
        queue: String,
        /// What is wrong with the message.
        reason: String,
    },
    /// Some entries of a batch call failed.
    #[error(
        "SQS {call} on `{}`: {failed} of {total} entries failed: {first}",
        shown(queue)
    )]
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
    /// Some messages of a batch publish were not sent, and the others were. SQS failed
    /// the entries of those not sent, also when they were tried again, and the messages
    /// after them were not tried. On a FIFO queue a failed entry is not tried again once
    /// SQS stored a later message of its group in the same call (nor is a failed one of
    /// that group after it): it would be stored out of order, so it is named not sent, and
    /// `first` says so where it is the first. Where a call failed as a whole (no answer,
    /// or an error for the call), its messages are `unconfirmed` instead: SQS may have
    /// stored them, so they are not sent again, and sending them again yourself may store
    /// them twice.
    #[error(
        "SQS SendMessageBatch on `{}`: {}: {first}",
        shown(queue),
        not_sent_counts(not_sent.len(), unconfirmed.len(), *total)
    )]
    NotSent {
        /// The queue.
        queue: String,
        /// The indices, in the publish, of the messages not sent, in order.
        not_sent: Vec<usize>,
        /// The indices of the messages whose call failed as a whole, in order.
        unconfirmed: Vec<usize>,
        /// How many messages the publish had.
        total: usize,
        /// The first failure's code and message, or the failed call's error.
        first: String,
    },
    /// SQS answered a call successfully but not as its API says it does (an attribute
    /// missing or not a number): the text says what was wrong.
    #[error("SQS {call} on `{}` answered unexpectedly: {detail}", shown(queue))]
    Unexpected {
        /// The API operation.
        call: &'static str,
        /// The queue.
        queue: String,
        /// What was missing or malformed.
        detail: String,
    },
    /// A queue's settings cannot work with this transport; the text says why.
    #[error("invalid SQS configuration: {0}")]
    Config(String),
}

impl SqsError {
    /// This error as the core's publish error for `destination`, named as given:
    /// [`conveyor::Error::Refused`] for a message SQS (or SNS) cannot carry as it is
    /// ([`SqsError::InvalidMessage`], found before anything is sent),
    /// [`conveyor::Error::Publish`] for anything else.
    pub(crate) fn into_publish(self, destination: String) -> conveyor::Error {
        let source = Box::new(self);
        match *source {
            SqsError::InvalidMessage { .. } => conveyor::Error::Refused {
                destination,
                source,
            },
            _ => conveyor::Error::Publish {
                destination,
                source,
            },
        }
    }

    /// The SDK error from `call` on `queue`: [`SqsError::NoSuchQueue`] where SQS answered
    /// that the queue does not exist, [`SqsError::Call`] otherwise; either keeps it whole.
    pub(crate) fn from_sdk<E, R>(call: &'static str, queue: &str, error: SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        if no_such_queue(&error) {
            SqsError::NoSuchQueue {
                queue: redacted(queue).into_owned(),
                source: Some(Box::new(error)),
            }
        } else {
            SqsError::call(call, queue, error)
        }
    }

    /// An SDK error from `call` on `queue`, kept whole as the source.
    pub(crate) fn call<E, R>(call: &'static str, queue: &str, error: SdkError<E, R>) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        SqsError::Call {
            call,
            queue: redacted(queue).into_owned(),
            source: Box::new(error),
        }
    }

    /// A failed SNS call on `topic`.
    #[cfg(feature = "sns")]
    pub(crate) fn sns_call<E, R>(call: &'static str, topic: &str, error: SdkError<E, R>) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        SqsError::SnsCall {
            call,
            topic: topic.to_string(),
            source: Box::new(error),
        }
    }
}

/// The most characters of a queue or attribute name an error text quotes: SQS's longest
/// queue name, so a name SQS takes is always quoted whole.
const MAX_SHOWN_NAME_CHARS: usize = 80;

/// The most characters of a queue URL an error text quotes: more than any SQS queue URL
/// has (an endpoint, an account and a name of at most 80 characters).
const MAX_SHOWN_URL_CHARS: usize = 200;

/// "3 of 25 messages not sent", with the unconfirmed ones where there are any.
fn not_sent_counts(not_sent: usize, unconfirmed: usize, total: usize) -> String {
    match (not_sent, unconfirmed) {
        (_, 0) => format!("{not_sent} of {total} messages not sent"),
        (0, _) => format!(
            "{unconfirmed} of {total} messages unconfirmed (their call failed as a whole; SQS may have stored them)"
        ),
        _ => format!(
            "{unconfirmed} of {total} messages unconfirmed (their call failed as a whole; SQS may have stored them) and {not_sent} not sent"
        ),
    }
}

/// `name` (a queue name or URL, an attribute name) as an error text quotes it: whole when
/// it is no longer than a valid one can be, else its first characters and `…`, cut at a
/// character boundary. Control characters are escaped, so a quoted name stays on its line.
/// A URL's password is `***` ([`redacted`]).
pub(crate) fn shown(name: &str) -> Cow<'_, str> {
    let max = if is_url(name) {
        MAX_SHOWN_URL_CHARS
    } else {
        MAX_SHOWN_NAME_CHARS
    };
    match redacted(name) {
        Cow::Borrowed(name) => conveyor::kit::bounded(name, max),
        Cow::Owned(name) => Cow::Owned(conveyor::kit::bounded(&name, max).into_owned()),
    }
}

/// `name`, a queue name or URL as the user gave it, with a URL's password replaced by
/// `***`: what errors, spans and metrics keep of it. A queue URL may carry user
/// information (a gateway in front of SQS), and secrets never reach logs or errors.
pub(crate) fn redacted(name: &str) -> Cow<'_, str> {
    if is_url(name) && conveyor::kit::url_password(name).is_some() {
        Cow::Owned(conveyor::kit::redact_url(name))
    } else {
        Cow::Borrowed(name)
    }
}

/// Whether SQS answered that the queue does not exist, in either spelling of the code.
pub(crate) fn no_such_queue<E, R>(error: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    match error {
        SdkError::ServiceError(context) => matches!(
            context.err().code(),
            Some("AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist")
        ),
        _ => false,
    }
}

/// Whether a failed call can never succeed by trying again: SQS answered with an error
/// code known to be permanent (see [`PERMANENT_CODES`]): the queue is gone, access is
/// denied, the credentials or the signature are refused, the queue's KMS key cannot be
/// used, the request itself is invalid. Everything else may heal and is a passing error: timeouts, connection failures,
/// 5xx, throttling, and any code (or 4xx without one) this transport does not recognise.
pub(crate) fn cannot_heal<E>(error: &SdkError<E, HttpResponse>) -> bool
where
    E: ProvideErrorMetadata,
{
    match error {
        SdkError::ServiceError(context) => permanent(context.err().code()),
        _ => false,
    }
}

/// Error codes that never heal by trying again. SQS speaks JSON with query-compatible
/// codes: the SDK takes a modelled error's code from the `x-amzn-query-error` header
/// (`AWS.SimpleQueueService.NonExistentQueue`, `KMS.AccessDeniedException`, ...), and
/// where that header is missing (an emulator) from the body's `__type`, the shape's name
/// (`QueueDoesNotExist`, `KmsAccessDenied`, ...); both spellings are listed. Credential
/// and signature errors come from AWS's front end, not SQS's model, under their own
/// codes, in both the query and the JSON protocols' spellings.
const PERMANENT_CODES: &[&str] = &[
    // The queue does not exist, or its URL names none.
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "InvalidAddress",
    // SQS refuses the operation on this queue, or requests not over HTTPS/SigV4.
    "AWS.SimpleQueueService.UnsupportedOperation",
    "UnsupportedOperation",
    "InvalidSecurity",
    // The request itself is refused: the pump sends the same one again.
    "InvalidParameterValue",
    "MissingParameter",
    "ValidationError",
    "ValidationException",
    // Access denied.
    "AccessDenied",
    "AccessDeniedException",
    "NotAuthorized",
    "OptInRequired",
    // Unknown, invalid or missing credentials; a signature that does not match.
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "MissingAuthenticationToken",
    "MissingAuthenticationTokenException",
    "IncompleteSignature",
    "IncompleteSignatureException",
    "SignatureDoesNotMatch",
    "InvalidSignatureException",
    // The queue's KMS key cannot be used (KMS.ThrottlingException / KmsThrottled heal).
    "KMS.AccessDeniedException",
    "KmsAccessDenied",
    "KMS.DisabledException",
    "KmsDisabled",
    "KMS.NotFoundException",
    "KmsNotFound",
    "KMS.InvalidStateException",
    "KmsInvalidState",
    "KMS.InvalidKeyUsageException",
    "KmsInvalidKeyUsage",
    "KMS.OptInRequired",
    "KmsOptInRequired",
];

fn permanent(code: Option<&str>) -> bool {
    code.is_some_and(|code| PERMANENT_CODES.contains(&code))
}

#[cfg(test)]
mod tests {
    use aws_sdk_sqs::error::DisplayErrorContext;
    use aws_sdk_sqs::operation::send_message::SendMessageError;

    use super::*;
    use crate::testing::answering_once;

    #[test]
    fn names_are_quoted_whole_up_to_the_longest_valid_one_and_cut_beyond() {
        let valid = "q".repeat(80);
        assert_eq!(shown(&valid), valid.as_str());
        assert_eq!(shown(&"q".repeat(81)), format!("{}…", "q".repeat(80)));
        // Cut at a character boundary: 80 characters of two bytes each, then `…`.
        assert_eq!(shown(&"é".repeat(100)), format!("{}…", "é".repeat(80)));
        // A queue URL of any real length is whole; only an oversize one is cut.
        let url = format!("https://sqs.ap-southeast-2.amazonaws.com/123456789012/{valid}");
        assert_eq!(shown(&url), url.as_str());
        let oversize = format!("http://{}", "h".repeat(1000));
        assert_eq!(shown(&oversize).chars().count(), 201);
        assert!(shown(&oversize).ends_with('…'));
        // A control character cannot break the line the name is quoted on.
        assert_eq!(shown("a\nb\u{1b}"), "a\\nb\\u{1b}");
    }

    #[test]
    fn error_texts_quote_only_the_start_of_an_oversize_queue_name() {
        let queue = "q".repeat(5000);
        let errors = [
            SqsError::Call {
                call: "SendMessage",
                queue: queue.clone(),
                source: "refused".into(),
            },
            SqsError::NoSuchQueue {
                queue: queue.clone(),
                source: None,
            },
            SqsError::BatchEntries {
                call: "SendMessageBatch",
                queue: queue.clone(),
                failed: 1,
                total: 2,
                first: "InternalError: busy".into(),
            },
            SqsError::Unexpected {
                call: "GetQueueUrl",
                queue: queue.clone(),
                detail: "no queue URL".into(),
            },
        ];
        for error in errors {
            let text = error.to_string();
            assert!(
                text.contains(&format!("`{}…`", "q".repeat(80))) && !text.contains(&"q".repeat(81)),
                "{text}"
            );
        }
    }

    #[test]
    fn a_missing_queue_refused_access_and_refused_credentials_cannot_heal() {
        for code in [
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
            "AccessDenied",
            "AccessDeniedException",
            "InvalidClientTokenId",
            "UnrecognizedClientException",
            "SignatureDoesNotMatch",
            "InvalidSignatureException",
            "KMS.AccessDeniedException",
            "KmsAccessDenied",
            "KMS.DisabledException",
            "KMS.NotFoundException",
            "KMS.InvalidStateException",
            "KmsInvalidState",
            "InvalidParameterValue",
        ] {
            assert!(permanent(Some(code)), "{code}");
        }
    }

    #[test]
    fn unknown_codes_throttling_timeouts_and_server_errors_heal() {
        for code in [
            "ThrottlingException",
            "RequestThrottled",
            "OverLimit",
            "KMS.ThrottlingException",
            "KmsThrottled",
            "ExpiredToken",
            "RequestExpired",
            "InternalError",
            "ServiceUnavailable",
            "AWS.SimpleQueueService.SomethingNew",
            "SomethingNew",
        ] {
            assert!(!permanent(Some(code)), "{code}");
        }
        assert!(!permanent(None));
    }

    /// What `cannot_heal` says of the SDK's error for a `ReceiveMessage` that SQS answers
    /// with `status`, `headers` and `body`: the SDK parses the code as it does from SQS.
    async fn receive_answered(status: &str, headers: &str, body: &str) -> bool {
        let (client, server) = answering_once(status, headers, body).await;
        let error = client
            .receive_message()
            .queue_url("http://127.0.0.1/123456789012/q")
            .send()
            .await
            .expect_err("the answer is an error");
        server.await.unwrap();
        assert!(
            matches!(error, SdkError::ServiceError(_)),
            "{}",
            DisplayErrorContext(&error)
        );
        cannot_heal(&error)
    }

    #[tokio::test]
    async fn sqs_codes_as_the_sdk_reads_them() {
        // SQS names a modelled error in the query-compatible header; the SDK takes that.
        assert!(
            receive_answered(
                "400 Bad Request",
                "x-amzn-query-error: AWS.SimpleQueueService.NonExistentQueue;Sender\r\n",
                r#"{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"gone"}"#,
            )
            .await
        );
        assert!(
            receive_answered(
                "400 Bad Request",
                "x-amzn-query-error: KMS.DisabledException;Sender\r\n",
                r#"{"__type":"com.amazonaws.sqs#KmsDisabled","message":"disabled"}"#,
            )
            .await
        );
        // Without the header (an emulator), the shape's name from `__type`.
        assert!(
            receive_answered(
                "400 Bad Request",
                "",
                r#"{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"gone"}"#,
            )
            .await
        );
        // Credentials refused by AWS's front end.
        assert!(
            receive_answered(
                "400 Bad Request",
                "",
                r#"{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"The security token included in the request is invalid."}"#,
            )
            .await
        );
    }

    /// The SDK's error for a `SendMessage` that SQS answers with the error `code`.
    async fn send_answered(code: &str) -> SdkError<SendMessageError, HttpResponse> {
        let (client, server) = answering_once(
            "400 Bad Request",
            &format!("x-amzn-query-error: {code};Sender\r\n"),
            &format!(r#"{{"__type":"com.amazonaws.sqs#{code}","message":"said {code}"}}"#),
        )
        .await;
        let error = client
            .send_message()
            .queue_url("http://127.0.0.1/123456789012/orders")
            .message_body("x")
            .send()
            .await
            .expect_err("the answer is an error");
        server.await.unwrap();
        error
    }

    /// One error of each variant (`NoSuchQueue` with and without SQS's answer), those
    /// with an SDK error as their source made from what SQS answers, and each as every
    /// core error the transport wraps one in (the publish error, `Refused` or `Publish`;
    /// `Transport`; `Subscribe`), by label. The match below has no wildcard: a new
    /// variant does not compile until it is named there, and fails the count until it is
    /// made here.
    async fn every_error() -> Vec<(String, BoxError)> {
        let errors = vec![
            SqsError::from_sdk(
                "SendMessage",
                "orders",
                send_answered("InternalError").await,
            ),
            SqsError::from_sdk(
                "SendMessage",
                "orders",
                send_answered("QueueDoesNotExist").await,
            ),
            SqsError::call(
                "ReceiveMessage",
                "orders",
                SdkError::<SendMessageError, HttpResponse>::construction_failure("no endpoint"),
            ),
            SqsError::SnsCall {
                call: "Publish",
                topic: "alerts".into(),
                source: Box::new(SdkError::<SendMessageError, HttpResponse>::timeout_error(
                    "no answer in 5 s",
                )),
            },
            SqsError::NoSuchQueue {
                queue: "orders".into(),
                source: None,
            },
            SqsError::InvalidMessage {
                queue: "orders".into(),
                reason: "a delay of 1200s is over SQS's 15 minutes".into(),
            },
            SqsError::BatchEntries {
                call: "DeleteMessageBatch",
                queue: "orders".into(),
                failed: 1,
                total: 2,
                first: "InternalError: busy".into(),
            },
            SqsError::NotSent {
                queue: "orders".into(),
                not_sent: vec![1],
                unconfirmed: vec![2],
                total: 3,
                first: "InternalError: busy".into(),
            },
            SqsError::Unexpected {
                call: "GetQueueAttributes",
                queue: "orders".into(),
                detail: "no ApproximateNumberOfMessages".into(),
            },
            SqsError::Config("a FIFO dead-letter queue for a standard queue".into()),
        ];
        let mut seen = Vec::new();
        let mut all: Vec<(String, BoxError)> = Vec::new();
        for error in errors {
            let variant = match &error {
                SqsError::Call { .. } => "Call",
                SqsError::SnsCall { .. } => "SnsCall",
                SqsError::NoSuchQueue { source: None, .. } => "NoSuchQueue",
                SqsError::NoSuchQueue { .. } => "NoSuchQueue with SQS's answer",
                SqsError::InvalidMessage { .. } => "InvalidMessage",
                SqsError::BatchEntries { .. } => "BatchEntries",
                SqsError::NotSent { .. } => "NotSent",
                SqsError::Unexpected { .. } => "Unexpected",
                SqsError::Config(_) => "Config",
            };
            seen.push(variant);
            let label = format!("SqsError::{variant}");
            // The core's errors made of it: every way this crate wraps one.
            let publish = {
                let again = rebuilt(&error);
                again.into_publish("orders".into())
            };
            let transport = crate::broker::transport(rebuilt(&error));
            let subscribe = conveyor::Error::Subscribe {
                queue: "orders".into(),
                source: Box::new(rebuilt(&error)),
            };
            all.push((format!("{label} as the publish error"), Box::new(publish)));
            all.push((format!("{label} as Transport"), Box::new(transport)));
            all.push((format!("{label} as Subscribe"), Box::new(subscribe)));
            all.push((label, Box::new(error)));
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 9, "a variant is missing: {seen:?}");
        all
    }

    /// `error` again, its source (which is no `Clone`) as its text with the same causes.
    fn rebuilt(error: &SqsError) -> SqsError {
        match error {
            SqsError::Call {
                call,
                queue,
                source,
            } => SqsError::Call {
                call,
                queue: queue.clone(),
                source: Box::new(Copied::of(source.as_ref())),
            },
            SqsError::SnsCall {
                call,
                topic,
                source,
            } => SqsError::SnsCall {
                call,
                topic: topic.clone(),
                source: Box::new(Copied::of(source.as_ref())),
            },
            SqsError::NoSuchQueue { queue, source } => SqsError::NoSuchQueue {
                queue: queue.clone(),
                source: source
                    .as_ref()
                    .map(|source| Box::new(Copied::of(source.as_ref())) as BoxError),
            },
            SqsError::InvalidMessage { queue, reason } => SqsError::InvalidMessage {
                queue: queue.clone(),
                reason: reason.clone(),
            },
            SqsError::BatchEntries {
                call,
                queue,
                failed,
                total,
                first,
            } => SqsError::BatchEntries {
                call,
                queue: queue.clone(),
                failed: *failed,
                total: *total,
                first: first.clone(),
            },
            SqsError::NotSent {
                queue,
                not_sent,
                unconfirmed,
                total,
                first,
            } => SqsError::NotSent {
                queue: queue.clone(),
                not_sent: not_sent.clone(),
                unconfirmed: unconfirmed.clone(),
                total: *total,
                first: first.clone(),
            },
            SqsError::Unexpected {
                call,
                queue,
                detail,
            } => SqsError::Unexpected {
                call,
                queue: queue.clone(),
                detail: detail.clone(),
            },
            SqsError::Config(text) => SqsError::Config(text.clone()),
        }
    }

    /// An error's text and its causes', copied.
    #[derive(Debug)]
    struct Copied {
        text: String,
        source: Option<Box<Copied>>,
    }

    impl Copied {
        fn of(error: &(dyn std::error::Error + 'static)) -> Copied {
            Copied {
                text: error.to_string(),
                source: error.source().map(|source| Box::new(Copied::of(source))),
            }
        }
    }

    impl fmt::Display for Copied {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.text)
        }
    }

    impl std::error::Error for Copied {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.source.as_deref().map(|source| source as _)
        }
    }

    /// Every error this crate makes, and every core error it wraps one in, says each
    /// cause once: by `Display`, by its sources walked as anyhow does, by
    /// [`conveyor::Report`], and as the reason a handler's
    /// message is rejected with when the handler fails with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_error_says_each_cause_once_however_it_is_shown() {
        let again = every_error()
            .await
            .into_iter()
            .map(|(_, error)| error)
            .collect();
        conveyor_conformance::errors::assert_each_cause_said_once(every_error().await, again).await;
    }

    #[tokio::test]
    async fn an_unknown_client_error_is_a_passing_error() {
        assert!(
            !receive_answered(
                "400 Bad Request",
                "x-amzn-query-error: AWS.SimpleQueueService.SomethingNew;Sender\r\n",
                r#"{"__type":"com.amazonaws.sqs#SomethingNew","message":"new"}"#,
            )
            .await
        );
        assert!(
            !receive_answered("403 Forbidden", "", "{}").await,
            "no code"
        );
        assert!(
            !receive_answered("404 Not Found", "", "{}").await,
            "no code"
        );
        assert!(
            !receive_answered(
                "400 Bad Request",
                "x-amzn-query-error: RequestThrottled;Sender\r\n",
                r#"{"__type":"com.amazonaws.sqs#RequestThrottled","message":"slow down"}"#,
            )
            .await
        );
    }
}
