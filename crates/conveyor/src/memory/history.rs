//! What the in-process broker saw, kept for tests while recording is on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::headers::Headers;
use crate::kit;
use crate::message::PartitionKey;

/// A copy of a message as the broker held it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RecordedMessage {
    /// The payload bytes.
    pub payload: Bytes,
    /// The headers.
    pub headers: Headers,
    /// The partition key.
    pub partition_key: Option<PartitionKey>,
    /// How many times it had been received when recorded (0 when published).
    pub receive_count: u32,
}

impl RecordedMessage {
    /// The payload decoded as JSON.
    ///
    /// # Errors
    ///
    /// serde's error when the payload is not JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// A message rejected from a queue: dead-lettered, or discarded where the queue has no
/// dead-letter queue.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Rejected {
    /// The message as it was rejected.
    pub message: RecordedMessage,
    /// Why it was rejected.
    pub reason: String,
    /// The dead-letter queue it went to; `None` means it was discarded.
    pub dead_letter_queue: Option<String>,
}

#[derive(Default)]
struct Log {
    published: HashMap<String, Vec<RecordedMessage>>,
    acked: HashMap<String, Vec<RecordedMessage>>,
    rejected: HashMap<String, Vec<Rejected>>,
}

/// The broker's history: off by default, so a long-running local service keeps nothing.
#[derive(Default)]
pub(super) struct History {
    recording: AtomicBool,
    log: Mutex<Log>,
}

impl History {
    pub(super) fn set_recording(&self, on: bool) {
        self.recording.store(on, Ordering::Relaxed);
    }

    pub(super) fn is_recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Holds the log, so whoever records next waits until the guard is dropped.
    #[cfg(test)]
    pub(super) fn hold(&self) -> impl Drop + '_ {
        kit::lock(&self.log)
    }

    fn with_log<T>(&self, f: impl FnOnce(&mut Log) -> T) -> T {
        f(&mut kit::lock(&self.log))
    }

    pub(super) fn record_published(&self, queue: &str, message: RecordedMessage) {
        if self.is_recording() {
            self.with_log(|log| {
                log.published
                    .entry(queue.to_string())
                    .or_default()
                    .push(message)
            });
        }
    }

    pub(super) fn record_acked(&self, queue: &str, message: RecordedMessage) {
        if self.is_recording() {
            self.with_log(|log| {
                log.acked
                    .entry(queue.to_string())
                    .or_default()
                    .push(message)
            });
        }
    }

    /// Rejects are always counted in stats; their contents only while recording.
    pub(super) fn record_rejected(&self, queue: &str, rejected: Rejected) {
        if self.is_recording() {
            self.with_log(|log| {
                log.rejected
                    .entry(queue.to_string())
                    .or_default()
                    .push(rejected)
            });
        }
    }

    pub(super) fn published(&self, queue: &str) -> Vec<RecordedMessage> {
        self.with_log(|log| log.published.get(queue).cloned().unwrap_or_default())
    }

    pub(super) fn acked(&self, queue: &str) -> Vec<RecordedMessage> {
        self.with_log(|log| log.acked.get(queue).cloned().unwrap_or_default())
    }

    pub(super) fn rejected(&self, queue: &str) -> Vec<Rejected> {
        self.with_log(|log| log.rejected.get(queue).cloned().unwrap_or_default())
    }
}
