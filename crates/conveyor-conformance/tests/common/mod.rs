//! The live brokers the cross-transport tests use, on 127.0.0.1, and unique names.
#![allow(dead_code)]

use std::time::Duration;

use conveyor_lapin::LapinBroker;
use conveyor_sqs::SqsBroker;

/// RabbitMQ, its connections shown on the server as `name`.
pub async fn rabbitmq(name: &str) -> LapinBroker {
    LapinBroker::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
        .connection_name(name)
        .connect()
        .await
        .expect("RabbitMQ on 127.0.0.1:5672 (run scripts/services/rabbitmq.sh)")
}

/// The SQS emulator, polling briefly so tests end quickly.
pub async fn sqs() -> SqsBroker {
    SqsBroker::builder()
        .endpoint("http://127.0.0.1:4566")
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .build()
        .await
        .expect("the SQS emulator on 127.0.0.1:4566 (run scripts/services/sqs.sh)")
}

/// A name no other test (or run) uses, for `test`'s `name`.
pub fn unique(test: &str, name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("t-{test}-{name}-{}-{nanos:x}", std::process::id())
}
