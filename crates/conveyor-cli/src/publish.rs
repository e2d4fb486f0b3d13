//! `conveyor publish QUEUE [--key K] [--header NAME=VALUE]… [--content-type T] [--lines]
//! [FILE|-]`.

use std::path::PathBuf;

use bytes::Bytes;
use conveyor::{Broker, Message};
use tokio::io::AsyncReadExt;

use crate::{Failure, out};

/// At most this many messages go in one batch (each batch is confirmed whole).
const BATCH: usize = 500;

/// What to publish, and how to dress each message.
#[derive(Debug)]
pub struct Input {
    /// The partition key of every message.
    pub key: Option<String>,
    /// Headers of every message.
    pub headers: Vec<(String, String)>,
    /// The content type; by default JSON's when the body is JSON.
    pub content_type: Option<String>,
    /// One message per line.
    pub lines: bool,
    /// The file; standard input when absent or `-`.
    pub file: Option<PathBuf>,
}

/// Publishes `input` to `queue`, each message confirmed by the broker.
pub async fn run<B: Broker>(broker: &B, queue: &str, input: Input) -> Result<(), Failure> {
    let bytes = read(input.file.as_ref()).await?;
    let bodies: Vec<Bytes> = if input.lines {
        bytes
            .split(|&byte| byte == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .filter(|line| !line.is_empty())
            .map(|line| bytes.slice_ref(line))
            .collect()
    } else {
        vec![bytes]
    };
    let count = bodies.len();
    let mut messages = bodies.into_iter().map(|body| message(&input, body));
    loop {
        let batch: Vec<Message> = messages.by_ref().take(BATCH).collect();
        if batch.is_empty() {
            break;
        }
        broker
            .publish_batch(queue, batch)
            .await
            .map_err(|error| Failure::call(&format!("publishing to `{queue}`"), &error))?;
    }
    let noun = if count == 1 { "message" } else { "messages" };
    out::print(&format!("published {count} {noun} to `{queue}`\n"))
}

fn message(input: &Input, body: Bytes) -> Message {
    let mut builder = Message::builder();
    for (name, value) in &input.headers {
        builder = builder.header(name.clone(), value.clone());
    }
    if let Some(key) = &input.key {
        builder = builder.partition_key(key.as_str());
    }
    match &input.content_type {
        Some(content_type) => builder = builder.content_type(content_type.clone()),
        None if serde_json::from_slice::<serde_json::Value>(&body).is_ok() => {
            builder = builder.content_type("application/json");
        }
        None => {}
    }
    builder.payload(body)
}

async fn read(file: Option<&PathBuf>) -> Result<Bytes, Failure> {
    let mut bytes = Vec::new();
    match file.filter(|path| path.as_os_str() != "-") {
        Some(path) => {
            bytes = tokio::fs::read(path).await.map_err(|error| {
                Failure::usage(format!("cannot read `{}`: {error}", path.display()))
            })?;
        }
        None => {
            tokio::io::stdin()
                .read_to_end(&mut bytes)
                .await
                .map_err(|error| Failure::usage(format!("cannot read standard input: {error}")))?;
        }
    }
    Ok(Bytes::from(bytes))
}
