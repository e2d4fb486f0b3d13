//! A subscription on a broker that is pulled from (SQS's `ReceiveMessage`, a JetStream
//! pull consumer's fetch, Redis's `XREADGROUP`): a pump receives at most one call ahead
//! of the handlers, a hand-over holds what it brought until the dispatcher takes it, and
//! a [`Keeper`] keeps what is held leased and makes the settlement calls.
//!
//! A transport gives its receive side (a [`Receive`]) and its settle side (a [`Keep`]) to
//! [`PullSubscriber::start`], which makes the rest: the leases, the deliveries' settler,
//! the call health and the in-flight limit. The pump and the keeper's settlements are
//! the subscription's [`Background`](crate::Background), which the dispatcher runs on the
//! mount's own task: each hand-over between them and the handlers is then a poll on that
//! task, not a wake-up of another one. The keeper's renewals run on a task of their own.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, oneshot, watch};

use super::beside::beside;
use super::health::CallHealth;
use super::keeper::{Keep, Keeper, KeeperSignals};
use super::lease::Leases;
use super::options::PullOptions;
use super::pace::RetryPause;
use super::policy::QueuePolicy;
use super::settler::{Alive, LeaseSettler};
use super::sync::{lock, wait_for};
use super::verdict::{Rejected, Verdict};
use crate::{
    Background, ConnectionProbe, Delivery, Error, Headers, PartitionKey, Report, Settle,
    SubscribeSettings, Subscriber,
};

/// A transport's receive side: its receive call, made by the pump.
pub trait Receive: Send + 'static {
    /// What the transport keeps of each message it holds: its [`Keep::Data`].
    type Data: Send + 'static;

    // The one `Vec` for every receive: a fresh list of a few deliveries is a large
    // allocation, the slow path of the allocator.
    /// One receive: each message it brought is held in `into` (so that it stays leased
    /// while it waits), then handed over as a delivery, or settled at once by the
    /// transport (one that is not to run yet, say). What a failed receive handed over is
    /// released.
    fn receive(
        &mut self,
        into: &mut Received<'_, Self::Data>,
    ) -> impl Future<Output = Result<(), ReceiveFailed>> + Send;
}

/// What one receive brought, as the pump hands it to [`Receive::receive`]: messages held
/// under their lease, and the deliveries made of them.
///
/// ```
/// # use std::time::Duration;
/// # use conveyor::Bytes;
/// # use conveyor::kit::{Received, ReceiveFailed};
/// /// What one receive call of a broker answered: a receipt and a payload each.
/// fn take(answer: Vec<(String, Bytes)>, into: &mut Received<'_, String>) {
///     for (receipt, payload) in answer {
///         let tag = into.hold(receipt, Duration::from_secs(30));
///         into.push(into.delivery(tag, payload).with_receive_count(1));
///     }
/// }
/// ```
pub struct Received<'a, D> {
    deliveries: &'a mut Vec<Delivery>,
    leases: &'a Leases<D>,
    settler: &'a Arc<dyn Settle>,
    queue: &'a Arc<str>,
}

impl<D> Received<'_, D> {
    /// Holds a message the broker leased to this subscription for `lease` from now: the
    /// keeper renews the lease until the message is settled. Its delivery tag.
    pub fn hold(&self, data: D, lease: Duration) -> u64 {
        self.leases.insert(data, lease)
    }

    /// Settles a held message without handing it over: one that came before its delay
    /// was over, one delivered more often than its queue allows.
    pub fn settle(&self, tag: u64, verdict: Verdict) {
        self.leases.settle(tag, verdict);
    }

    /// The delivery of the held message `tag`, settled through the subscription.
    pub fn delivery(&self, tag: u64, payload: Bytes) -> Delivery {
        Delivery::new(payload, self.queue.clone(), self.settler.clone(), tag)
    }

    /// Hands a delivery over to the dispatcher.
    pub fn push(&mut self, delivery: Delivery) {
        self.deliveries.push(delivery);
    }

    /// Hands the held message `tag` over as a delivery of its `attempts`-th receive, or,
    /// past its queue's max receive count (`policy`), sends it to the dead-letter queue
    /// without running it: for a transport that counts receives itself, as SQS's redrive
    /// policy does on the broker.
    pub fn deliver_or_dead_letter(
        &mut self,
        tag: u64,
        message: ReceivedMessage,
        attempts: u32,
        policy: &QueuePolicy,
    ) {
        let ReceivedMessage {
            payload,
            headers,
            partition_key,
        } = message;
        if let Some(reason) = policy.dead_letter_reason(attempts) {
            let rejected = Rejected {
                reason,
                attempt: attempts,
                payload,
                headers,
                partition_key,
            };
            self.settle(tag, Verdict::Reject(Box::new(rejected)));
            return;
        }
        let delivery = self
            .delivery(tag, payload)
            .with_headers(headers)
            .with_partition_key(partition_key)
            .with_receive_count(attempts.max(1))
            .with_redelivered(attempts > 1)
            .arrived_now();
        self.push(delivery);
    }

    /// Whether no delivery has been handed over yet.
    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }
}

/// What a receive brought of one message.
#[derive(Debug)]
pub struct ReceivedMessage {
    /// The payload.
    pub payload: Bytes,
    /// The headers.
    pub headers: Headers,
    /// The partition key, if it has one.
    pub partition_key: Option<PartitionKey>,
}

/// A receive that failed.
#[derive(Debug)]
pub struct ReceiveFailed {
    /// What went wrong.
    pub error: Box<dyn std::error::Error + Send + Sync>,
    /// Whether trying again can never help (the queue is gone, access is refused): the
    /// subscription then ends with [`Error::Subscribe`].
    pub for_good: bool,
}

impl PullSubscriber {
    /// A pulling subscription, started from its transport's receive side and settle side:
    /// the subscription's leases, its deliveries' settler, its call health and its
    /// in-flight limit (the mount's `max_in_flight` plus one receive) are made here. The
    /// pump and the keeper start with the dispatcher that adopts its
    /// [`background`](Subscriber::background), or on a task of their own at its first
    /// receive (or its stop, close or drop) when none does.
    pub fn start<R, K>(
        receive: R,
        keep: K,
        options: PullOptions,
        settings: &SubscribeSettings,
    ) -> PullSubscriber
    where
        R: Receive<Data = K::Data>,
        K: Keep,
    {
        let leases = Arc::new(Leases::default());
        let (alive, alive_watch) = Alive::new();
        // Only the settler keeps the keeper waiting for settlements: the pump's, and its
        // deliveries' clones.
        let settler: Arc<dyn Settle> = Arc::new(LeaseSettler::<K>::new(leases.clone(), alive));
        let health = CallHealth::default();
        let handover = Arc::new(Handover::default());
        let (closing, closing_watch) = watch::channel(false);
        let (stop, stop_watch) = watch::channel(false);
        let keeper = Keeper::new(keep, leases.clone(), &options, health.clone());
        let keeper = keeper.run(KeeperSignals {
            closing: closing_watch,
            draining: stop_watch.clone(),
            alive: alive_watch,
        });
        let (abandon, abandoned) = oneshot::channel::<()>();
        let (pump_done, pump_ended) = oneshot::channel::<()>();
        // Saturating: the core allows any size (`batch(usize::MAX)`).
        let limit = settings
            .max_in_flight
            .max(1)
            .saturating_add(options.receive_batch.max(1));
        let pump = pump(
            receive,
            Pumped {
                leases,
                settler,
                queue: options.queue.as_str().into(),
                limit,
            },
            handover.clone(),
            options.queue.clone(),
            health.clone(),
            stop_watch,
        );
        let pump = async move {
            let abandoned = async {
                if abandoned.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = pump => {}
                () = abandoned => {}
            }
            let _ = pump_done.send(());
        };
        let (finished, finished_watch) = oneshot::channel::<()>();
        let background = Background::new(async move {
            // Each polled only when woken: a settlement wakes the keeper, not the pump's
            // wait too.
            beside(pump, keeper).await;
            let _ = finished.send(());
        });
        PullSubscriber {
            queue: options.queue,
            handover,
            stop,
            closing,
            background: Some(background),
            pump_ended: Some(pump_ended),
            abandon: Some(abandon),
            finished: Some(finished_watch),
            receive_bound: options.receive_bound,
            health,
        }
    }
}

/// Deliveries received and not yet taken by the dispatcher: one receive's worth at most.
#[derive(Default)]
struct Handover {
    waiting: Mutex<Waiting>,
    /// Notified when the pump adds deliveries, fails, or the hand-over closes.
    arrived: Notify,
    /// Notified when the dispatcher takes the last one.
    emptied: Notify,
}

#[derive(Default)]
struct Waiting {
    ready: VecDeque<Delivery>,
    /// No more deliveries: receiving has stopped.
    closed: bool,
    /// Why the subscription cannot go on, for the dispatcher once `ready` is empty.
    failed: Option<Error>,
}

/// What the dispatcher finds in the hand-over.
enum Next {
    Delivery(Delivery),
    /// The subscription failed for good.
    Failed(Error),
    /// Receiving has stopped; nothing more will come.
    Closed,
    /// Nothing yet.
    Empty,
}

impl Handover {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        lock(&self.waiting)
    }

    /// Takes the next delivery; once none is left, the failure or the end.
    fn take(&self) -> Next {
        let mut waiting = self.lock();
        if let Some(delivery) = self.pop(&mut waiting) {
            return Next::Delivery(delivery);
        }
        if let Some(error) = waiting.failed.take() {
            return Next::Failed(error);
        }
        if waiting.closed {
            Next::Closed
        } else {
            Next::Empty
        }
    }

    /// Takes the next delivery, if one is waiting.
    fn take_ready(&self) -> Option<Delivery> {
        self.pop(&mut self.lock())
    }

    fn pop(&self, waiting: &mut Waiting) -> Option<Delivery> {
        let delivery = waiting.ready.pop_front()?;
        if waiting.ready.is_empty() {
            self.emptied.notify_waiters();
        }
        Some(delivery)
    }

    /// Moves a receive's deliveries in; leaves them where they are if receiving has
    /// stopped meanwhile (dropping them releases them).
    fn offer(&self, deliveries: &mut Vec<Delivery>) -> Result<(), ReceivingStopped> {
        {
            let mut waiting = self.lock();
            if waiting.closed {
                return Err(ReceivingStopped);
            }
            waiting.ready.extend(deliveries.drain(..));
        }
        self.arrived.notify_waiters();
        Ok(())
    }

    /// Stops taking deliveries and releases every waiting one (dropped outside the lock:
    /// each drop settles a release).
    fn close(&self) {
        let released = {
            let mut waiting = self.lock();
            waiting.closed = true;
            std::mem::take(&mut waiting.ready)
        };
        drop(released);
        self.arrived.notify_waiters();
        self.emptied.notify_waiters();
    }

    /// Ends the subscription with `error`, after the deliveries still waiting.
    fn fail(&self, error: Error) {
        {
            let mut waiting = self.lock();
            waiting.failed = Some(error);
            waiting.closed = true;
        }
        self.arrived.notify_waiters();
    }

    async fn wait_empty(&self) {
        wait_for(&self.emptied, || self.lock().ready.is_empty().then_some(())).await;
    }

    async fn next(&self) -> Next {
        wait_for(&self.arrived, || match self.take() {
            Next::Empty => None,
            next => Some(next),
        })
        .await
    }
}

/// The hand-over takes no more deliveries.
struct ReceivingStopped;

/// What the pump's receives are made into deliveries with, and its room: it receives
/// while fewer than `limit` messages are held.
struct Pumped<D> {
    leases: Arc<Leases<D>>,
    settler: Arc<dyn Settle>,
    /// The queue, as deliveries carry it.
    queue: Arc<str>,
    limit: usize,
}

/// Receives until told to stop. It receives once the dispatcher has taken the last
/// receive's deliveries and fewer than the limit are held; what the dispatcher cannot
/// take yet waits (leased) in the hand-over.
///
/// Stopping never cuts a receive short: one under way completes, and its deliveries are
/// released at once. A failed receive is logged as a warning and tried again after a
/// pause that doubles from 100 ms up to 30 s and resets on success ([`RetryPause`]); one
/// that can never succeed ([`ReceiveFailed::for_good`]) ends the subscription with
/// [`Error::Subscribe`].
async fn pump<R: Receive>(
    mut receive: R,
    pumped: Pumped<R::Data>,
    handover: Arc<Handover>,
    queue: String,
    health: CallHealth,
    mut stop: watch::Receiver<bool>,
) {
    let mut pause = RetryPause::new();
    let mut received = Vec::new();
    loop {
        let ready = async {
            handover.wait_empty().await;
            pumped.leases.room_for(pumped.limit).await;
        };
        tokio::select! {
            biased;
            () = stopped(&mut stop) => return,
            () = ready => {}
        }
        let mut into = Received {
            deliveries: &mut received,
            leases: &pumped.leases,
            settler: &pumped.settler,
            queue: &pumped.queue,
        };
        let result = receive.receive(&mut into).await;
        if result.is_err() {
            // Released (outside any lock: each drop settles).
            received.clear();
        }
        match result {
            Ok(()) => {
                pause.reset();
                health.succeeded();
                let count = received.len();
                tracing::trace!(queue, count, "received");
                if handover.offer(&mut received).is_err() {
                    tracing::debug!(
                        queue,
                        count,
                        "received after receiving stopped; releasing them"
                    );
                    received.clear();
                    return;
                }
            }
            Err(ReceiveFailed {
                error,
                for_good: true,
            }) => {
                tracing::error!(queue, error = %Report(&*error), "receive failed and cannot succeed by trying again; the subscription ends");
                handover.fail(Error::Subscribe {
                    queue: queue.clone(),
                    source: error,
                });
                return;
            }
            Err(ReceiveFailed { error, .. }) => {
                health.failed();
                let retry_in = pause.failed();
                tracing::warn!(queue, error = %Report(&*error), ?retry_in, "receive failed");
                tokio::select! {
                    biased;
                    () = stopped(&mut stop) => return,
                    () = tokio::time::sleep(retry_in) => {}
                }
            }
        }
    }
}

/// Resolves once receiving must stop (or the subscriber is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// A pulling subscription: its pump receives, its keeper keeps what was received leased
/// until settled and makes the settlement calls.
///
/// [`stop_receiving`](Subscriber::stop_receiving) stops the pump from receiving again and
/// releases every delivery received but not handed over; a receive under way is not cut
/// short: it completes and its deliveries are released at once. Closing waits for that
/// receive, then for the keeper to make every settlement's call. Dropping it without
/// closing does the same in the background: the pump finishes its receive and releases
/// what it brought, and the keeper goes on until every delivery is settled.
pub struct PullSubscriber {
    queue: String,
    handover: Arc<Handover>,
    stop: watch::Sender<bool>,
    closing: watch::Sender<bool>,
    /// The pump and the keeper's settlements, until the dispatcher adopts them or the
    /// subscription runs them on a task of its own.
    background: Option<Background>,
    pump_ended: Option<oneshot::Receiver<()>>,
    abandon: Option<oneshot::Sender<()>>,
    /// Sent once the pump and the keeper have both finished.
    finished: Option<oneshot::Receiver<()>>,
    receive_bound: Duration,
    health: CallHealth,
}

impl std::fmt::Debug for PullSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullSubscriber")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl PullSubscriber {
    /// Runs the background on a task of its own, unless the dispatcher adopted it.
    fn run_unadopted(&mut self) {
        if let Some(background) = self.background.take() {
            tokio::spawn(background);
        }
    }

    /// No new receive; every delivery waiting in the hand-over released.
    fn stop_now(&self) {
        self.stop.send_replace(true);
        self.handover.close();
    }
}

impl Subscriber for PullSubscriber {
    /// The mount shows as reconnecting while calls to the queue (receives, renewals,
    /// settlements) fail and are retried.
    fn connection(&self) -> Option<Arc<dyn ConnectionProbe>> {
        Some(Arc::new(self.health.clone()))
    }

    /// The pump and the keeper's settlement calls, for the mount's own task to run (the
    /// keeper's renewals keep a task of their own).
    fn background(&mut self) -> Option<Background> {
        self.background.take()
    }

    /// The next delivery of the last receive. An error that cannot heal comes back as
    /// [`Error::Subscribe`] once the deliveries received before it are taken; passing
    /// errors are retried inside the pump.
    async fn recv(&mut self) -> Option<Result<Delivery, Error>> {
        self.run_unadopted();
        match self.handover.next().await {
            Next::Delivery(delivery) => Some(Ok(delivery)),
            Next::Failed(error) => Some(Err(error)),
            Next::Closed | Next::Empty => None,
        }
    }

    /// The deliveries of one receive, up to `max`.
    async fn recv_batch(
        &mut self,
        max: usize,
        batch: &mut Vec<Delivery>,
    ) -> Option<Result<(), Error>> {
        self.run_unadopted();
        match self.handover.next().await {
            Next::Delivery(delivery) => batch.push(delivery),
            Next::Failed(error) => return Some(Err(error)),
            Next::Closed | Next::Empty => return None,
        }
        while batch.len() < max {
            match self.handover.take_ready() {
                Some(delivery) => batch.push(delivery),
                None => break,
            }
        }
        Some(Ok(()))
    }

    /// Makes no new receive and releases every delivery waiting in the hand-over, at
    /// once. A receive under way completes; its deliveries are released as it returns.
    async fn stop_receiving(&mut self) {
        self.run_unadopted();
        self.stop_now();
    }

    /// Waits for a receive still under way (up to the receive bound) and releases what it
    /// brought, then waits for the keeper to make every settlement's call.
    async fn close(mut self) {
        self.run_unadopted();
        self.stop_now();
        if let Some(mut pump_ended) = self.pump_ended.take()
            && tokio::time::timeout(self.receive_bound, &mut pump_ended)
                .await
                .is_err()
        {
            tracing::warn!(
                queue = self.queue,
                timeout = ?self.receive_bound,
                "a receive is still under way past its timeout; abandoning it (what it brings stays with the broker until its lease lapses)"
            );
            if let Some(abandon) = self.abandon.take() {
                let _ = abandon.send(());
            }
            let _ = pump_ended.await;
        }
        self.closing.send_replace(true);
        if let Some(finished) = self.finished.take() {
            let _ = finished.await;
        }
    }
}

impl Drop for PullSubscriber {
    fn drop(&mut self) {
        self.stop_now();
    }
}
