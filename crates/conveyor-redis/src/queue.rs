//! `RedisQueue`, a queue to mount on, and its subscription on the kit's pulling
//! subscriber: the pump reads new entries (`XREADGROUP`) and, every so often or when it
//! finds none, sweeps (moves delayed messages that are due into the stream, claims lapsed
//! or released entries); the keeper renews leases (an ownership-checked `XCLAIM`) and
//! settles.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conveyor::kit::{
    Keep, LeaseTimes, PullOptions, PullSubscriber, QueuePolicy, Receive, ReceiveFailed, Received,
    ReceivedMessage, Renewed, Taken, Verdict,
};
use conveyor::{Error, Publisher, Report, Source, SubscribeSettings};
use redis::aio::ConnectionManager;
use redis::streams::StreamPendingCountReply;
use tokio::time::Instant;

use crate::admin;
use crate::broker::{GROUP, Keys, RedisBroker, epoch_ms, policy};
use crate::error::call_error;
use crate::fields::{self, Entries, Entry, ReadEntries};
use crate::scripts::{LEAVE, MOVE_DUE, RENEW, RETRY_LATER};

/// A released message's idle time: past any lease, so the next receive claims it.
const RELEASED_IDLE_MS: u64 = 1 << 40;

/// The consumer a released entry is handed to until a receive claims it: one name for
/// every subscription, so that a closed subscription holds nothing and can leave its
/// group (see `RedisKeep::finished`) however much it released.
const RELEASED_CONSUMER: &str = "conveyor:released";

/// The most delayed messages one receive moves into the stream.
const MOVE_DUE_BATCH: usize = 1000;

/// How often a busy consumer sweeps: moves the delayed messages that are due into the
/// stream and claims lapsed or released entries. Between sweeps a receive is one
/// `XREADGROUP`, as a hand-written loop's; a retry is due at the earliest then, a lapsed
/// entry (leases are seconds long) hardly later than it lapsed. A consumer that finds
/// nothing new sweeps before it blocks, and one that knows a delayed message is due sweeps
/// then.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A Redis stream to mount a handler on, from [`RedisBroker::queue`].
///
/// ```no_run
/// # async fn run(broker: conveyor_redis::RedisBroker) {
/// // Read at most 16 entries per call (default: what the mount can hold).
/// let orders = broker.queue("orders").receive_batch(16);
/// # }
/// ```
#[derive(Clone)]
pub struct RedisQueue {
    broker: RedisBroker,
    name: String,
    receive_batch: Option<usize>,
}

impl fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisQueue")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RedisQueue {
    pub(crate) fn new(broker: RedisBroker, name: String) -> Self {
        RedisQueue {
            broker,
            name,
            receive_batch: None,
        }
    }

    /// The most entries one read asks for (default: as many as the mount can hold, its
    /// batch size or else its `max_in_flight`; this only lowers it). Zero fails the app's
    /// start with [`Error::Config`].
    pub fn receive_batch(mut self, messages: usize) -> Self {
        self.receive_batch = Some(messages);
        self
    }
}

impl Source for RedisQueue {
    type Subscriber = PullSubscriber;

    fn queue_name(&self) -> &str {
        &self.name
    }

    fn messaging_system(&self) -> &'static str {
        "redis"
    }

    /// AsyncAPI has no Redis bindings: an `x-redis` one names the stream and its group.
    fn describe(&self, queue: &str) -> conveyor::asyncapi::QueueDescription {
        let binding = serde_json::json!({ "stream": queue, "group": GROUP });
        conveyor::asyncapi::QueueDescription::new(Some(fields::PARTITION_KEY_HEADER))
            .channel_binding("x-redis", binding)
    }

    fn publisher(&self) -> Option<conveyor::SharedPublisher> {
        Some(conveyor::SharedPublisher::new(self.broker.clone()))
    }

    /// Makes the stream and group if missing, reads the queue's policy, and starts the
    /// pump (on a connection of its own: its reads block) and the keeper.
    async fn subscribe(self, settings: SubscribeSettings) -> Result<PullSubscriber, Error> {
        let subscribe_error = |source: Error| Error::Subscribe {
            queue: self.name.clone(),
            source: Box::new(source),
        };
        if self.name.is_empty() {
            return Err(Error::config("a queue needs a name"));
        }
        if self.receive_batch == Some(0) {
            return Err(Error::config(format!(
                "receive_batch(0) on Redis queue `{}`: a read takes at least one entry",
                self.name
            )));
        }
        let keys = Keys::of(&self.name);
        admin::make_group(&self.broker, &keys)
            .await
            .map_err(subscribe_error)?;
        let policy = policy(&self.broker, &keys).await.map_err(subscribe_error)?;
        let broker_settings = self.broker.settings().clone();
        let lease = policy
            .visibility_timeout
            .unwrap_or(broker_settings.visibility_timeout);
        let reads = crate::broker::connect(
            self.broker.client(),
            broker_settings
                .receive_wait
                .saturating_add(broker_settings.response_timeout),
        )
        .await
        .map_err(|e| subscribe_error(crate::error::failed("connect", &self.name, Report(&e))))?;
        let consumer = conveyor::kit::unique_id();
        let held = settings.max_in_flight.max(1);
        let wanted = settings
            .batch_size
            .map_or(held, |size| size.max(1))
            .min(self.receive_batch.unwrap_or(usize::MAX))
            .max(1);
        let wake = Arc::new(Wake::default());
        let keep = RedisKeep {
            wake: wake.clone(),
            broker: self.broker.clone(),
            keys: keys.clone(),
            consumer: consumer.clone(),
            lease,
            dead_letter_queue: policy.dead_letter_queue.clone(),
        };
        let options = PullOptions {
            queue: self.name.clone(),
            lease,
            receive_batch: wanted,
            receive_bound: broker_settings
                .receive_wait
                .saturating_add(broker_settings.response_timeout)
                .saturating_add(Duration::from_secs(1)),
            settle_linger: broker_settings.settle_linger,
            settle_batch: 256,
        };
        let mut read_now = redis::pipe();
        read_command(&keys.stream, &consumer, wanted, None, &mut read_now);
        let receive = RedisReceive {
            reads,
            commands: self.broker.commands(),
            keys,
            name: self.name.as_str().into(),
            consumer,
            wanted,
            read_now,
            lease,
            receive_wait: broker_settings.receive_wait,
            policy,
            swept_at: None,
            next_due: None,
            wake,
        };
        Ok(PullSubscriber::start(receive, keep, options, &settings))
    }
}

/// How the keeper wakes its subscription's pump from a blocking read when it puts a
/// message back (a retry-after into the delayed set, a release): a read of new entries
/// would not see it, and would wait out the fetch wait first.
///
/// The keeper counts what it puts back, then unblocks the read connection (`CLIENT
/// UNBLOCK`) if the pump blocks; the pump notes its connection's id before it blocks and
/// does not block if the count moved since it last swept. With both sequentially
/// consistent, one of the two sees the other; a read noted but not yet at the server is
/// unblocked on a later try. A wake missed all the same (the connection replaced between
/// its id and its read) costs what no wake would: the read ends with its fetch wait.
#[derive(Debug, Default)]
struct Wake {
    /// Messages the keeper has put back, counted.
    put_back: AtomicU64,
    /// The read connection's client id while the pump blocks in it; 0 when it does not.
    blocked_id: AtomicU64,
}

/// What a subscription keeps of an entry it holds: its id.
pub(crate) struct Held {
    id: String,
    /// Which attempt this delivery is.
    attempts: u32,
}

struct RedisReceive {
    reads: ConnectionManager,
    /// The broker's connection, for the calls that do not block.
    commands: ConnectionManager,
    keys: Keys,
    name: Arc<str>,
    consumer: String,
    wanted: usize,
    /// The read of new entries that does not block: the same every time, so built once.
    read_now: redis::Pipeline,
    lease: Duration,
    receive_wait: Duration,
    policy: QueuePolicy,
    /// When this consumer last swept, if it has.
    swept_at: Option<Instant>,
    /// When the next delayed message is due (ms since the epoch), as the last sweep found.
    next_due: Option<u64>,
    wake: Arc<Wake>,
}

impl RedisReceive {
    /// Whether this receive sweeps before it reads: the first, one `SWEEP_EVERY` after the
    /// last, or once a delayed message is due.
    fn sweep_due(&self) -> bool {
        let Some(swept_at) = self.swept_at else {
            return true;
        };
        swept_at.elapsed() >= SWEEP_EVERY
            || self
                .next_due
                .is_some_and(|due| due <= epoch_ms(Duration::ZERO))
    }

    fn failed(&self, call: &'static str, error: &redis::RedisError) -> ReceiveFailed {
        ReceiveFailed {
            for_good: error.code() == Some("NOGROUP"),
            error: Box::new(call_error(call, &self.name, Report(error))),
        }
    }

    /// Sweeps: moves delayed messages that are due into the stream, and looks up lapsed
    /// or released entries and new ones (without blocking), in one round trip.
    async fn look(&mut self) -> Result<Looked, ReceiveFailed> {
        let lease_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let mut move_due = MOVE_DUE.prepare_invoke();
        move_due
            .key(&self.keys.stream)
            .key(&self.keys.delayed)
            .arg(epoch_ms(Duration::ZERO))
            .arg(MOVE_DUE_BATCH)
            .arg(&self.keys.delayed_entry);
        let mut pipe = redis::pipe();
        pipe.ignore_errors().invoke_script(&move_due);
        pipe.cmd("XPENDING")
            .arg(&self.keys.stream)
            .arg(GROUP)
            .arg("IDLE")
            .arg(lease_ms)
            .arg("-")
            .arg("+")
            .arg(self.wanted);
        self.read_command(None, &mut pipe);
        type Replies = (
            redis::RedisResult<i64>,
            redis::RedisResult<StreamPendingCountReply>,
            redis::RedisResult<ReadEntries>,
        );
        let (moved, lapsed, fresh): Replies = pipe
            .query_async(&mut self.reads)
            .await
            .map_err(|e| self.failed("EVALSHA, XPENDING and XREADGROUP", &e))?;
        let next_due = match moved {
            Ok(next_due) => Some(next_due),
            // Not cached on the server (it restarted, or its scripts were flushed): this
            // loads it, for this receive and those after.
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                Some(
                    move_due
                        .invoke_async(&mut self.reads)
                        .await
                        .map_err(|e| self.failed("EVAL", &e))?,
                )
            }
            Err(e) => return Err(self.failed("EVAL", &e)),
        };
        Ok(Looked {
            next_due: next_due.and_then(|due| u64::try_from(due).ok()),
            lapsed: lapsed.map_err(|e| self.failed("XPENDING", &e))?,
            fresh: entries(fresh.map_err(|e| self.failed("XREADGROUP", &e))?),
        })
    }

    /// The entries of `lapsed` (their lease lapsed, or released), claimed for this
    /// consumer, each with how often it was delivered before.
    async fn claim(
        &mut self,
        lapsed: StreamPendingCountReply,
    ) -> Result<Vec<(Entry, u32)>, ReceiveFailed> {
        if lapsed.ids.is_empty() {
            return Ok(Vec::new());
        }
        let lease_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let mut claim = redis::cmd("XCLAIM");
        claim
            .arg(&self.keys.stream)
            .arg(GROUP)
            .arg(&self.consumer)
            .arg(lease_ms);
        for pending in &lapsed.ids {
            claim.arg(&pending.id);
        }
        let Entries(claimed) = claim
            .query_async(&mut self.reads)
            .await
            .map_err(|e| self.failed("XCLAIM", &e))?;
        Ok(claimed
            .into_iter()
            .map(|entry| {
                let before = lapsed
                    .ids
                    .iter()
                    .find(|pending| pending.id == entry.id)
                    .map_or(0, |pending| {
                        u32::try_from(pending.times_delivered).unwrap_or(u32::MAX)
                    });
                (entry, before)
            })
            .collect())
    }

    /// Adds to `pipe` the read of new entries: at once, or blocking up to `block` for
    /// the first.
    fn read_command(&self, block: Option<Duration>, pipe: &mut redis::Pipeline) {
        read_command(&self.keys.stream, &self.consumer, self.wanted, block, pipe);
    }

    /// New entries, blocking up to `block` for the first, unless the keeper put a message
    /// back since `put_back_seen` (then none: the next receive sweeps it in). The keeper
    /// can wake the read meanwhile ([`Wake`]).
    async fn block_for(
        &mut self,
        block: Duration,
        put_back_seen: u64,
    ) -> Result<Vec<(Entry, u32)>, ReceiveFailed> {
        // A server that refuses `CLIENT ID` (an ACL) leaves the read unwakeable: it ends
        // after the fetch wait, as a read of new entries always would.
        let id: u64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut self.reads)
            .await
            .unwrap_or(0);
        self.wake.blocked_id.store(id, Ordering::SeqCst);
        if self.wake.put_back.load(Ordering::SeqCst) != put_back_seen {
            self.wake.blocked_id.store(0, Ordering::SeqCst);
            return Ok(Vec::new());
        }
        let read = self.read(Some(block)).await;
        self.wake.blocked_id.store(0, Ordering::SeqCst);
        read
    }

    /// New entries: those there now, or blocking up to `block` for the first.
    async fn read(&mut self, block: Option<Duration>) -> Result<Vec<(Entry, u32)>, ReceiveFailed> {
        // A read that does not block shares the connection the settlements go on: an ack
        // and the next read then travel together, as a hand-written loop pipelines them.
        let read: redis::RedisResult<(ReadEntries,)> = if block.is_some() {
            let mut pipe = redis::pipe();
            self.read_command(block, &mut pipe);
            pipe.query_async(&mut self.reads).await
        } else {
            self.read_now.query_async(&mut self.commands).await
        };
        let (read,) = read.map_err(|e| self.failed("XREADGROUP", &e))?;
        Ok(entries(read))
    }
}

/// What a receive found before it would block.
struct Looked {
    /// When the next delayed message is due (ms since the epoch), if one waits.
    next_due: Option<u64>,
    /// Entries whose lease lapsed, or released, to claim.
    lapsed: StreamPendingCountReply,
    /// New entries read, never delivered before.
    fresh: Vec<(Entry, u32)>,
}

/// Adds to `pipe` the read of up to `wanted` new entries of `stream` for `consumer`: at
/// once, or blocking up to `block` for the first.
fn read_command(
    stream: &str,
    consumer: &str,
    wanted: usize,
    block: Option<Duration>,
    pipe: &mut redis::Pipeline,
) {
    let read = pipe
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(wanted);
    if let Some(block) = block {
        read.arg("BLOCK")
            .arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX).max(1));
    }
    read.arg("STREAMS").arg(stream).arg(">");
}

/// The entries of a read, none delivered before.
fn entries(ReadEntries(read): ReadEntries) -> Vec<(Entry, u32)> {
    read.into_iter().map(|entry| (entry, 0)).collect()
}

impl Receive for RedisReceive {
    type Data = Held;

    /// Reads new entries; when a sweep is due or there are none, moves delayed messages
    /// that are due into the stream, claims lapsed or released entries and reads again;
    /// and when there are still none, blocks for them at most until the fetch wait ends or
    /// the next delayed message is due.
    async fn receive(&mut self, into: &mut Received<'_, Held>) -> Result<(), ReceiveFailed> {
        // What the keeper had put back before this receive's sweep, which sees it.
        let put_back_seen = self.wake.put_back.load(Ordering::SeqCst);
        let mut entries = if self.sweep_due() {
            Vec::new()
        } else {
            self.read(None).await?
        };
        if entries.is_empty() {
            let Looked {
                next_due,
                lapsed,
                fresh,
            } = self.look().await?;
            self.swept_at = Some(Instant::now());
            self.next_due = next_due;
            entries = self.claim(lapsed).await?;
            entries.extend(fresh);
        }
        if entries.is_empty() {
            let mut block = self.receive_wait;
            if let Some(due) = self.next_due {
                let until_due = Duration::from_millis(due.saturating_sub(epoch_ms(Duration::ZERO)));
                block = block.min(until_due);
            }
            entries = self.block_for(block, put_back_seen).await?;
        }
        let mut gone = Vec::new();
        for (entry, delivered_before) in entries {
            let Some(incoming) = entry.message else {
                // Deleted while pending: nothing to deliver; acknowledge it.
                gone.push(entry.id);
                continue;
            };
            let attempts = incoming
                .attempts_before
                .saturating_add(delivered_before)
                .saturating_add(1);
            let held = Held {
                id: entry.id,
                attempts,
            };
            let tag = into.hold(held, self.lease);
            let received = ReceivedMessage {
                payload: incoming.payload,
                headers: incoming.headers,
                partition_key: incoming.key,
            };
            into.deliver_or_dead_letter(tag, received, attempts, &self.policy);
        }
        if !gone.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("XACK")
                .arg(&self.keys.stream)
                .arg(GROUP)
                .arg(&gone)
                .query_async(&mut self.reads)
                .await;
        }
        Ok(())
    }
}

struct RedisKeep {
    wake: Arc<Wake>,
    broker: RedisBroker,
    keys: Keys,
    consumer: String,
    lease: Duration,
    dead_letter_queue: Option<String>,
}

/// A batch of settlements ready for their commands.
#[derive(Default)]
pub(crate) struct Calls {
    /// Acknowledged and deleted.
    done: Vec<String>,
    released: Vec<String>,
    /// Entry, when due (ms), attempts made.
    later: Vec<(String, u64, u32)>,
}

impl RedisKeep {
    /// Wakes the pump from a blocking read, after a message was put back ([`Wake`]).
    async fn wake_pump(&self) {
        self.wake.put_back.fetch_add(1, Ordering::SeqCst);
        self.unblock_read().await;
    }

    /// Ends the pump's blocking read, if it is in one. A read noted as blocking but not
    /// yet at the server is unblocked again after a short pause (five tries in some
    /// 150 ms), once it is.
    async fn unblock_read(&self) {
        let mut pause = Duration::from_millis(5);
        for _ in 0..5 {
            let id = self.wake.blocked_id.load(Ordering::SeqCst);
            if id == 0 {
                return;
            }
            let unblocked: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .query_async(&mut self.broker.commands())
                .await;
            match unblocked {
                Ok(1) => return,
                Ok(_) => {}
                Err(e) => {
                    // An ACL that refuses it: the read ends after the fetch wait instead.
                    tracing::debug!(queue = self.keys.stream, error = %Report(&e), "cannot wake the subscription's read");
                    return;
                }
            }
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2);
        }
    }
}

impl Keep for RedisKeep {
    type Data = Held;
    type Renewal = String;
    type Drawn = (String, u32);
    type Prepared = Calls;

    fn renewal(&self, _tag: u64, held: &Held, _times: LeaseTimes) -> Option<String> {
        Some(held.id.clone())
    }

    /// Resets each entry's idle time if this consumer still holds it; one another
    /// consumer claimed (its lease lapsed) is lost.
    async fn renew(&self, due: &[&String], _retry: bool) -> Result<Vec<Renewed>, String> {
        let sent = Instant::now();
        let mut invocation = RENEW.key(&self.keys.stream);
        invocation.arg(GROUP).arg(&self.consumer);
        for id in due {
            invocation.arg(id.as_str());
        }
        let renewed: Vec<i64> = invocation
            .invoke_async(&mut self.broker.commands())
            .await
            .map_err(|e| Report(&e).to_string())?;
        Ok(due
            .iter()
            .enumerate()
            .map(|(i, _)| match renewed.get(i) {
                Some(1) => Renewed::Until(sent + self.lease),
                _ => Renewed::Lost("another consumer claimed it".to_string()),
            })
            .collect())
    }

    fn draw(held: &mut Held) -> (String, u32) {
        (held.id.clone(), held.attempts)
    }

    async fn prepare(&self, taken: Vec<Taken<(String, u32)>>) -> Calls {
        let mut calls = Calls::default();
        for Taken {
            data: (id, attempts),
            verdict,
            ..
        } in taken
        {
            match verdict {
                Verdict::Ack => calls.done.push(id),
                // Claimable by the next receive at once.
                Verdict::Retry { after: None } => calls.released.push(id),
                // Back in the delayed set, due after the delay.
                Verdict::Retry { after: Some(delay) } => {
                    calls.later.push((id, epoch_ms(delay), attempts));
                }
                Verdict::Reject(rejected) => match &self.dead_letter_queue {
                    None => {
                        tracing::warn!(
                            queue = self.keys.stream,
                            reason = rejected.reason,
                            "rejected a message on a queue with no dead-letter queue: dropped"
                        );
                        calls.done.push(id);
                    }
                    Some(dead_letter_queue) => {
                        match self
                            .broker
                            .publish(dead_letter_queue, rejected.into_dead_letter())
                            .await
                        {
                            Ok(()) => calls.done.push(id),
                            Err(error) => {
                                tracing::error!(
                                    queue = self.keys.stream,
                                    dead_letter_queue,
                                    error = %Report(&error),
                                    "cannot dead-letter a rejected message; it is delivered again"
                                );
                                calls.released.push(id);
                            }
                        }
                    }
                },
            }
        }
        calls
    }

    /// Acks (and deletes) in one round trip, releases in another, retries for later one
    /// script each. What fails comes back after its lease: nothing is lost.
    async fn settle(&self, calls: Calls) -> bool {
        let mut commands = self.broker.commands();
        let stream = &self.keys.stream;
        let mut pipe = redis::pipe();
        if !calls.done.is_empty() {
            pipe.cmd("XACK")
                .arg(stream)
                .arg(GROUP)
                .arg(&calls.done)
                .ignore();
            pipe.cmd("XDEL").arg(stream).arg(&calls.done).ignore();
        }
        if !calls.released.is_empty() {
            pipe.cmd("XCLAIM")
                .arg(stream)
                .arg(GROUP)
                .arg(RELEASED_CONSUMER)
                .arg(0)
                .arg(&calls.released)
                .arg("IDLE")
                .arg(RELEASED_IDLE_MS)
                .arg("JUSTID")
                .ignore();
        }
        let put_back = !calls.released.is_empty() || !calls.later.is_empty();
        let mut failures = Vec::new();
        if (!calls.done.is_empty() || !calls.released.is_empty())
            && let Err(e) = pipe.query_async::<()>(&mut commands).await
        {
            failures.push(Report(&e).to_string());
        }
        for (id, due, attempts) in calls.later {
            let moved: redis::RedisResult<i64> = RETRY_LATER
                .key(stream)
                .key(&self.keys.delayed)
                .arg(GROUP)
                .arg(&id)
                .arg(due)
                .arg(&self.keys.delayed_entry)
                .arg(conveyor::kit::unique_id())
                .arg(attempts)
                .invoke_async(&mut commands)
                .await;
            if let Err(e) = moved {
                failures.push(Report(&e).to_string());
            }
        }
        if let Some(first) = failures.first() {
            tracing::error!(
                queue = self.keys.stream,
                failed = failures.len(),
                first,
                "cannot settle; these messages come back after their lease"
            );
        }
        if put_back {
            self.wake_pump().await;
        }
        failures.is_empty()
    }

    /// Ends a blocking read under way, so that closing does not wait for its fetch wait.
    async fn stopped_receiving(&self) {
        self.unblock_read().await;
    }

    /// Takes this subscription's consumer out of the group, unless it still holds an
    /// entry (one whose settlement failed): a consumer name per subscription would
    /// otherwise pile up in the group with every restart.
    async fn finished(&self) {
        let left: redis::RedisResult<i64> = LEAVE
            .key(&self.keys.stream)
            .arg(GROUP)
            .arg(&self.consumer)
            .invoke_async(&mut self.broker.commands())
            .await;
        match left {
            Ok(1) => {}
            Ok(_) => tracing::debug!(
                queue = self.keys.stream,
                "the consumer stays in the group: it holds entries (they are claimed by others once their lease lapses)"
            ),
            Err(e) => tracing::debug!(
                queue = self.keys.stream,
                error = %Report(&e),
                "cannot take the consumer out of the group"
            ),
        }
    }
}
