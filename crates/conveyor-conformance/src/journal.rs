//! The scenarios' handler and what it writes down: every run of every job.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use conveyor::kit;
use conveyor::{DeliveryInfo, Json, Outcome, PartitionKey, State};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// What a published job asks its handler to do.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Job {
    /// Unique within a scenario.
    pub id: u64,
    /// Fail this many attempts, then succeed.
    #[serde(default)]
    pub fail_first: u32,
    /// Fail every attempt.
    #[serde(default)]
    pub always_fail: bool,
    /// On the first attempt, ask to be retried after this many milliseconds.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// Panic in the handler.
    #[serde(default)]
    pub panic: bool,
}

impl Job {
    /// A job that succeeds at once.
    pub fn new(id: u64) -> Self {
        Job {
            id,
            ..Job::default()
        }
    }
}

/// One run of the handler.
#[derive(Clone, Debug)]
pub struct Run {
    /// The job's id.
    pub id: u64,
    /// The delivery's partition key.
    pub key: Option<String>,
    /// The attempt, as the delivery told it.
    pub attempt: u32,
    /// When the run started.
    pub started: Instant,
    /// When it ended.
    pub finished: Instant,
    /// Whether it ended in an ack.
    pub acked: bool,
}

/// Every run of the scenario's handler, shared with the test through `State`.
#[derive(Clone, Debug)]
pub struct Journal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    runs: Mutex<Vec<Run>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
    /// Handlers waiting at the gate.
    waiting: AtomicUsize,
    /// Closed (no permits) while the scenario holds handlers back.
    gate: Semaphore,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            inner: Arc::new(Inner {
                runs: Mutex::new(Vec::new()),
                running: AtomicUsize::new(0),
                most_running: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                gate: Semaphore::new(Semaphore::MAX_PERMITS),
            }),
        }
    }
}

impl Journal {
    /// A journal whose handlers wait at a closed gate until [`open`](Self::open).
    pub fn gated() -> Self {
        let journal = Journal::default();
        journal.inner.gate.forget_permits(Semaphore::MAX_PERMITS);
        journal
    }

    /// Lets every handler through the gate.
    pub fn open(&self) {
        self.inner.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// How many handlers are waiting at the gate.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::SeqCst)
    }

    fn runs_locked(&self) -> MutexGuard<'_, Vec<Run>> {
        kit::lock(&self.inner.runs)
    }

    /// Every run so far, in the order they ended.
    pub fn runs(&self) -> Vec<Run> {
        self.runs_locked().clone()
    }

    /// The runs of job `id`.
    pub fn runs_of(&self, id: u64) -> Vec<Run> {
        self.runs_locked()
            .iter()
            .filter(|run| run.id == id)
            .cloned()
            .collect()
    }

    /// The ids acked so far, in the order acked, duplicates included.
    pub fn acked(&self) -> Vec<u64> {
        self.runs_locked()
            .iter()
            .filter(|run| run.acked)
            .map(|run| run.id)
            .collect()
    }

    /// How many distinct jobs have been acked.
    pub fn acked_distinct(&self) -> usize {
        let mut ids = self.acked();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// The most handlers that ever ran at once.
    pub fn most_running(&self) -> usize {
        self.inner.most_running.load(Ordering::SeqCst)
    }

    /// Notes that a handler starts; returns when it may go on.
    pub async fn start(&self) {
        let now = self.inner.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.inner.most_running.fetch_max(now, Ordering::SeqCst);
        self.inner.waiting.fetch_add(1, Ordering::SeqCst);
        if let Ok(permit) = self.inner.gate.acquire().await {
            drop(permit);
        }
        self.inner.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Notes how a run ended.
    pub fn finish(&self, run: Run) {
        self.runs_locked().push(run);
        self.inner.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The scenarios' handler: does what the job asks and writes the run down.
pub async fn handle(
    Json(job): Json<Job>,
    key: Option<PartitionKey>,
    info: DeliveryInfo,
    State(journal): State<Journal>,
) -> Result<Outcome, String> {
    journal.start().await;
    let started = Instant::now();
    // A moment of work, so that runs that could overlap do.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let attempt = info.attempt;
    let outcome = if job.panic {
        journal.finish(Run {
            id: job.id,
            key: key.map(|k| k.to_string()),
            attempt,
            started,
            finished: Instant::now(),
            acked: false,
        });
        panic!("job {} panics", job.id);
    } else if job.always_fail || attempt <= job.fail_first {
        Err("planned failure".to_string())
    } else if let (Some(ms), 1) = (job.retry_after_ms, attempt) {
        Ok(Outcome::RetryAfter(Duration::from_millis(ms)))
    } else {
        Ok(Outcome::Ack)
    };
    journal.finish(Run {
        id: job.id,
        key: key.map(|k| k.to_string()),
        attempt,
        started,
        finished: Instant::now(),
        acked: outcome == Ok(Outcome::Ack),
    });
    outcome
}
