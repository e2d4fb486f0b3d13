//! Runnable Conveyor services: see the `[[example]]` targets of this package.

use std::time::Duration;

use conveyor_sqs::SqsBroker;

/// The SQS broker the examples use: the emulator `scripts/services/sqs.sh` starts on
/// 127.0.0.1:4566, with its test credentials, polling briefly so that an example ends
/// soon after its work. A service on AWS builds it with `SqsBroker::builder()` and the
/// standard credential chain instead.
pub async fn sqs_emulator() -> Result<SqsBroker, conveyor::Error> {
    SqsBroker::builder()
        .endpoint("http://127.0.0.1:4566")
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .build()
        .await
}

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's pages (`docs/`), compiled and run as doctests so they stay true.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/README.md")]
    struct Contents;
    #[doc = include_str!("../docs/first-service.md")]
    struct FirstService;
    #[doc = include_str!("../docs/dispatch-modes.md")]
    struct DispatchModes;
    #[doc = include_str!("../docs/ordering.md")]
    struct Ordering;
    #[doc = include_str!("../docs/failures.md")]
    struct Failures;
    #[doc = include_str!("../docs/shutdown.md")]
    struct Shutdown;
    #[doc = include_str!("../docs/observability.md")]
    struct Observability;
    #[doc = include_str!("../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../docs/migrating.md")]
    struct Migrating;
    #[doc = include_str!("../docs/handlers.md")]
    struct Handlers;
    #[doc = include_str!("../docs/outputs.md")]
    struct Outputs;
    #[doc = include_str!("../docs/request-reply.md")]
    struct RequestReply;
    #[doc = include_str!("../docs/outbox.md")]
    struct Outbox;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../docs/asyncapi.md")]
    struct AsyncApi;
    #[doc = include_str!("../docs/guarantees.md")]
    struct Guarantees;
    #[doc = include_str!("../docs/rabbitmq.md")]
    struct RabbitMq;
    #[doc = include_str!("../docs/sqs.md")]
    struct Sqs;
    #[doc = include_str!("../docs/nats.md")]
    struct Nats;
    #[doc = include_str!("../docs/redis.md")]
    struct Redis;
    #[doc = include_str!("../docs/pulling.md")]
    struct Pulling;
}
