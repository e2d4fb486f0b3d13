//! `conveyor publish QUEUE [--key K] [--header NAME=VALUE]… [--content-type T] [--lines]
//! [FILE|-]`.

use std::path::PathBuf;

use bytes::Bytes;
use conveyor::Message;
use conveyor_sqs::SqsError;
use tokio::io::AsyncReadExt;

use crate::pass::ready;
use crate::target::Inspect;
use crate::{Failure, out};

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

/// Publishes `input` to `queue`, each message confirmed by the broker, in calls of at
/// most [`Inspect::PUBLISH_CALL`] messages, each checked whole before any of it is sent.
/// The queue is looked up first where a publish would make it
/// ([`Inspect::PUBLISH_MAKES_QUEUES`]).
/// A failure says how many were published, and which lines (of the input, counting
/// empty ones) were not, or may not have been.
pub async fn run<B: Inspect>(broker: &B, queue: &str, input: Input) -> Result<(), Failure> {
    // Refused before the input is read: a key the broker would drop is a mistake on the
    // command line, not something to report as published.
    if input.key.is_some()
        && let Some(why) = B::drops_key(queue)
    {
        return Err(Failure::usage(format!("--key: {why}")));
    }
    // Where a publish would make a missing queue, a mistyped name fails here instead.
    if B::PUBLISH_MAKES_QUEUES {
        ready(broker, queue).await?;
    }
    let bytes = read(input.file.as_ref()).await?;
    // Each body with its line number, from 1.
    let bodies: Vec<(usize, Bytes)> = if input.lines {
        bytes
            .split(|&byte| byte == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .enumerate()
            .filter(|(_, line)| !line.is_empty())
            .map(|(index, line)| (index + 1, bytes.slice_ref(line)))
            .collect()
    } else {
        vec![(1, bytes)]
    };
    let count = bodies.len();
    let mut published = 0;
    for call in bodies.chunks(B::PUBLISH_CALL.max(1)) {
        let messages: Vec<Message> = call
            .iter()
            .map(|(_, body)| message(&input, body.clone()))
            .collect();
        if let Err(error) = broker.publish_batch(queue, messages).await {
            let lines: Vec<usize> = call.iter().map(|(line, _)| *line).collect();
            // A message the broker returned or nacked, or one never sent, did not arrive;
            // of several, which one is not known, so such a call may still have delivered.
            let unsent = matches!(error, conveyor::Error::Refused { .. })
                || (call.len() == 1 && B::undelivered(&error));
            let (sent, outcome) = outcome(&lines, &error, unsent);
            return Err(Failure::broker(format!(
                "published {} of {count} to `{queue}`{}{outcome}: {}",
                published + sent,
                if input.lines {
                    ""
                } else {
                    " (the file as one message)"
                },
                conveyor::Report(&error)
            )));
        }
        published += call.len();
    }
    let noun = if count == 1 { "message" } else { "messages" };
    out::print(&format!("published {count} {noun} to `{queue}`\n"))
}

/// Of a call of the messages on `lines` that failed with `error`: how many were
/// published all the same, and which lines were not (or may not have been), as text.
/// `unsent`: the error says that none of the call arrived.
fn outcome(lines: &[usize], error: &conveyor::Error, unsent: bool) -> (usize, String) {
    match not_sent_of(error) {
        Some((not_sent, unconfirmed)) => {
            let pick = |indices: &[usize]| -> Vec<usize> {
                indices
                    .iter()
                    .filter_map(|&i| lines.get(i).copied())
                    .collect()
            };
            let (not_sent, unconfirmed) = (pick(not_sent), pick(unconfirmed));
            let sent = lines
                .len()
                .saturating_sub(not_sent.len())
                .saturating_sub(unconfirmed.len());
            let mut text = String::new();
            if !not_sent.is_empty() {
                text.push_str(&format!("; not sent: {}", spans(&not_sent)));
            }
            if !unconfirmed.is_empty() {
                text.push_str(&format!(
                    "; unconfirmed, may have arrived: {}",
                    spans(&unconfirmed)
                ));
            }
            (sent, text)
        }
        None if unsent => (0, format!("; not sent: {}", spans(lines))),
        None => (
            0,
            format!("; may or may not have arrived: {}", spans(lines)),
        ),
    }
}

/// The messages of an SQS publish that were not sent, and those whose call failed as a
/// whole, by index in the call: the others were sent.
fn not_sent_of(error: &conveyor::Error) -> Option<(&[usize], &[usize])> {
    let conveyor::Error::Publish { source, .. } = error else {
        return None;
    };
    match source.downcast_ref::<SqsError>()? {
        SqsError::NotSent {
            not_sent,
            unconfirmed,
            ..
        } => Some((not_sent, unconfirmed)),
        _ => None,
    }
}

/// Line numbers as `line 3`, or `lines 3-7, 9`.
fn spans(lines: &[usize]) -> String {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for &line in lines {
        match spans.last_mut() {
            Some((_, end)) if *end + 1 == line => *end = line,
            _ => spans.push((line, line)),
        }
    }
    let text: Vec<String> = spans
        .iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect();
    let noun = if lines.len() == 1 { "line" } else { "lines" };
    format!("{noun} {}", text.join(", "))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_numbers_are_shown_as_spans() {
        assert_eq!(spans(&[3]), "line 3");
        assert_eq!(spans(&[1, 2, 3, 5, 7, 8]), "lines 1-3, 5, 7-8");
    }

    #[test]
    fn a_call_refused_before_sending_sent_none_of_its_lines() {
        let error = conveyor::Error::config("x");
        assert_eq!(
            outcome(&[4, 5, 7], &error, true),
            (0, "; not sent: lines 4-5, 7".to_string())
        );
        assert_eq!(
            outcome(&[4], &error, false),
            (0, "; may or may not have arrived: line 4".to_string())
        );
    }
}
