//! Test support: a broker on the local emulator, and an SDK client whose one call SQS
//! answers as a test says, so that the error codes of real SQS, which the emulator does
//! not send, can be tested.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A broker builder for the SQS emulator the live tests use (`scripts/services/sqs.sh`).
pub(crate) fn emulator() -> crate::SqsBrokerBuilder {
    crate::SqsBroker::builder()
        .endpoint("http://127.0.0.1:4566")
        .region("us-east-1")
        .static_credentials("test", "test")
}

/// A client (without retries) whose first call is answered with `status`, `headers` and
/// `body` as SQS's JSON protocol answers; the task ends once the answer is written.
pub(crate) async fn answering_once(
    status: &str,
    headers: &str,
    body: &str,
) -> (Client, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/x-amz-json-1.0\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        // The whole request, headers and body, before answering.
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let read = stream.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the request ended early");
            request.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .map_or(0, |n| n.trim().parse().unwrap());
                if request.len() >= end + 4 + length {
                    break;
                }
            }
        }
        stream.write_all(response.as_bytes()).await.unwrap();
        stream.shutdown().await.unwrap();
    });
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(crate::broker::https_client())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .retry_config(RetryConfig::disabled())
        .build();
    (Client::from_conf(config), server)
}
