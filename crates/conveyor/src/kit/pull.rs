//! A subscription on a broker that is pulled from (SQS's `ReceiveMessage`, a JetStream
//! pull consumer's fetch, Redis's `XREADGROUP`): a pump receives at most one call ahead
//! of the handlers, a hand-over holds what it brought until the dispatcher takes it, and
//! a [`Keeper`] keeps what is held leased and makes the settlement calls.
//!
//! A transport gives a [`Receive`] (its receive call) and a [`Keep`] (its renewal and
//! settlement calls); [`Pull::start`] answers with a [`PullSubscriber`], the whole
//! [`Subscriber`]. The pump and the keeper's settlements are its
//! [`Background`](crate::Background), which the dispatcher runs on the mount's own task:
//! each hand-over between them and the handlers is then a poll on that task, not a
//! wake-up of another one (on Redis, that took a sequential mount's CPU time per message
//! from about twice a raw loop's to the same, BENCHMARKS.md). The keeper's renewals run
//! on a task of their own.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot, watch};

use super::beside::beside;
use super::keeper::{Keep, Keeper, KeeperSignals};
use super::lease::Leases;
use super::pace::RetryPause;
use super::sync::{lock, wait_for};
use crate::{Background, ConnectionProbe, Delivery, Error, Report, Subscriber};

/// Whether calls to a queue fail now (and are retried): set by the last receive, renewal
/// or settlement call. The mounts on the queue show as reconnecting while it is.
///
/// ```
/// use conveyor::ConnectionProbe;
/// use conveyor::kit::CallHealth;
///
/// let health = CallHealth::default();
/// health.failed();
/// assert!(health.is_lost());
/// health.succeeded();
/// assert!(!health.is_lost());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallHealth(Arc<AtomicBool>);

impl CallHealth {
    /// A call failed.
    pub fn failed(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// A call succeeded.
    pub fn succeeded(&self) {
        // Read first: the flag is shared by every call, and a store on each success would
        // move its cache line between cores for nothing.
        if self.0.load(Ordering::Relaxed) {
            self.0.store(false, Ordering::Relaxed);
        }
    }
}

impl ConnectionProbe for CallHealth {
    fn is_lost(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A transport's receive call, made by the pump.
pub trait Receive: Send + 'static {
    // The one `Vec` for every receive: a fresh list of a few deliveries is a large
    // allocation, the slow path of the allocator.
    /// One receive: adds the deliveries it brought to `into` (empty when called), each
    /// already recorded in the subscription's [`Leases`] (so that it stays leased while it
    /// waits) and settled through them. The pump hands the same `Vec` to every receive,
    /// so a receive allocates nothing for its list. What a failed receive added is
    /// released.
    fn receive(
        &mut self,
        into: &mut Vec<Delivery>,
    ) -> impl Future<Output = Result<(), ReceiveFailed>> + Send;
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

/// Keeps the deliveries' settler alive in the keeper's eyes: the keeper finishes once
/// the subscription closes, or once every clone of this is dropped (nothing more can be
/// settled). A transport's [`Settle`](crate::Settle) holds one.
#[derive(Clone, Debug)]
pub struct Alive {
    _sender: Arc<watch::Sender<()>>,
}

impl Alive {
    /// A token, and what the keeper watches ([`KeeperSignals::alive`]): it closes once
    /// every clone of the token is dropped. [`Pull`] makes this pair itself; a transport
    /// needs it only to run a [`Keeper`] on its own (in its tests, say).
    pub fn new() -> (Alive, watch::Receiver<()>) {
        let (sender, watch) = watch::channel(());
        (
            Alive {
                _sender: Arc::new(sender),
            },
            watch,
        )
    }
}

/// How a pulling subscription runs.
#[derive(Clone, Debug)]
pub struct PullOptions {
    /// The queue, as logs and errors name it.
    pub queue: String,
    /// The pump receives only while fewer than this many messages are held (waiting,
    /// running, or settled with their call not made yet).
    pub limit: usize,
    /// How long a settlement waits for others to share its call.
    pub linger: Duration,
    /// The longest one receive can take (its long poll and its timeout): closing waits
    /// that long for one under way, then abandons it.
    pub receive_bound: Duration,
    /// Marked by the pump's receives and the keeper's renewals.
    pub health: CallHealth,
}

/// A pulling subscription about to start: its [`Leases`], shared with the transport's
/// [`Receive`], [`Keep`] and settler.
///
/// A transport makes one per subscription, gives [`leases`](Self::leases) to its
/// receive call (which records each message it brings) and to its settler (which holds
/// an [`alive`](Self::alive) token), then [`start`](Self::start)s it; conveyor-sqs's
/// `subscriber.rs` is a worked example.
pub struct Pull<D, O> {
    leases: Arc<Leases<D, O>>,
    alive: Alive,
    alive_watch: watch::Receiver<()>,
}

impl<D: Send + 'static, O: Send + 'static> Default for Pull<D, O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<D: Send + 'static, O: Send + 'static> Pull<D, O> {
    /// A subscription with no message held yet.
    pub fn new() -> Self {
        let (alive, alive_watch) = Alive::new();
        Pull {
            leases: Arc::new(Leases::default()),
            alive,
            alive_watch,
        }
    }

    /// The messages the subscription holds.
    pub fn leases(&self) -> &Arc<Leases<D, O>> {
        &self.leases
    }

    /// A token for the deliveries' settler (see [`Alive`]).
    pub fn alive(&self) -> Alive {
        self.alive.clone()
    }

    /// The subscription, its pump and keeper ready: they start with the dispatcher that
    /// adopts its [`background`](Subscriber::background), or on a task of their own at its
    /// first receive (or its stop, close or drop) when none does.
    pub fn start<R, K>(self, receive: R, keep: K, options: PullOptions) -> PullSubscriber
    where
        R: Receive,
        K: Keep<Data = D, Op = O>,
    {
        let Pull {
            leases,
            alive,
            alive_watch,
        } = self;
        // Only the settler's clones keep the keeper waiting for settlements.
        drop(alive);
        let handover = Arc::new(Handover::default());
        let (closing, closing_watch) = watch::channel(false);
        let (stop, stop_watch) = watch::channel(false);
        let keeper = Keeper::new(keep, leases.clone(), options.linger, options.health.clone());
        let keeper = keeper.run(KeeperSignals {
            closing: closing_watch,
            draining: stop_watch.clone(),
            alive: alive_watch,
        });
        let (abandon, abandoned) = oneshot::channel::<()>();
        let (pump_done, pump_ended) = oneshot::channel::<()>();
        let pump = pump(
            receive,
            Room {
                leases,
                limit: options.limit,
            },
            handover.clone(),
            options.queue.clone(),
            options.health.clone(),
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
            health: options.health,
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

/// Room for another receive: fewer than `limit` messages held.
struct Room<D, O> {
    leases: Arc<Leases<D, O>>,
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
async fn pump<R: Receive, D, O>(
    mut receive: R,
    room: Room<D, O>,
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
            room.leases.room_for(room.limit).await;
        };
        tokio::select! {
            biased;
            () = stopped(&mut stop) => return,
            () = ready => {}
        }
        let result = receive.receive(&mut received).await;
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
