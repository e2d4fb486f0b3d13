//! The keeper of a pulling subscription: keeps every message it holds leased (the
//! extender, on a task of its own) and makes the settlement calls (where it is polled,
//! the mount's own task once the dispatcher adopts it), given a transport's [`Keep`].
//!
//! Renewals go out beside the settlements, so a settlement call that hangs or keeps
//! failing never holds the renewals up. A settled message is renewed too until its call
//! goes out, a batch at a time (the work a settlement needs first, a dead letter's send,
//! runs while it is still renewed), so such a call leaves at most its own batch unrenewed.
//! A batch the keeper took no longer takes the pump's room: the pump receives while the
//! batch's call is out, as a hand-written loop pipelines its ack with its next read.
//! They stay ordered where it matters (see [`Leases`]): the visibility a settlement sets
//! is always the last word; a renewal never lands after it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use super::health::CallHealth;
use super::lease::{LeaseTimes, Leases, Taken};
use super::options::PullOptions;
use super::pace::RetryPause;
use super::settle::SettleQueue;

/// A transport's settle side: how its broker renews a lease, and how each
/// [`Verdict`](super::Verdict) becomes the broker's calls.
///
/// The keeper renews, every third of the [`lease`](PullOptions::lease), the leases that
/// lapse within half of it, a [`settle_batch`](PullOptions::settle_batch) per
/// [`renew`](Self::renew) call, the calls side by side. It takes settlements a batch at a
/// time, runs [`prepare`](Self::prepare) while their leases are still renewed, then
/// [`settle`](Self::settle) once no renewal covers them any more.
pub trait Keep: Send + Sync + 'static {
    /// What the transport keeps of each message held (a receipt handle, an entry id).
    type Data: Send + 'static;
    /// A lease due, as the renewal call takes it.
    type Renewal: Send + Sync + 'static;
    /// What a taken settlement carries out of its message's data.
    type Drawn: Send + 'static;
    /// What [`prepare`](Self::prepare) hands to [`settle`](Self::settle).
    type Prepared: Send + 'static;

    /// The renewal of a lease due (`tag`'s, with `data`), or `None` to leave it out (one
    /// renewed as far as the broker allows, say).
    fn renewal(&self, tag: u64, data: &Self::Data, times: LeaseTimes) -> Option<Self::Renewal>;
    /// One renewal call for `due`. Answers per renewal, in order; a call that failed as a
    /// whole is an error with why (the keeper tries again soon).
    fn renew(
        &self,
        due: &[&Self::Renewal],
        retry: bool,
    ) -> impl Future<Output = Result<Vec<Renewed>, String>> + Send;
    /// Takes out of a settled message's data what its settlement needs.
    fn draw(data: &mut Self::Data) -> Self::Drawn;
    /// The work a batch of settlements needs while their leases are still renewed (a
    /// dead letter's send before the original is removed).
    fn prepare(
        &self,
        taken: Vec<Taken<Self::Drawn>>,
    ) -> impl Future<Output = Self::Prepared> + Send;
    /// The settlement calls, made once no renewal covers their messages. Whether the
    /// broker took every call (the keeper marks the queue's [`CallHealth`] by it); one
    /// whose calls failed for good leaves its messages to come back once their leases
    /// lapse.
    fn settle(&self, prepared: Self::Prepared) -> impl Future<Output = bool> + Send;
    /// The transport's own record of a message it holds, for
    /// [`Delivery::transport_record`](crate::Delivery::transport_record): what the core's
    /// view leaves out. `None` by default.
    fn record(data: &Self::Data) -> Option<Box<dyn std::any::Any + Send>> {
        let _ = data;
        None
    }
    /// Called once the subscription stops receiving: a receive that waits on the broker
    /// for new messages (a long poll, a blocking read) can be cut short here, so that
    /// closing does not wait it out. Nothing by default.
    fn stopped_receiving(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
    /// The subscription's last call, once it is closed (or its settlers are gone) and
    /// every settlement's call has been made: what the broker keeps for this subscription
    /// alone (a Redis consumer's name in its group, say) can go. Nothing by default.
    fn finished(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// How one lease fared in a renewal call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewed {
    /// Renewed: it lapses at this instant (counted from when the call was sent).
    Until(Instant),
    /// The broker no longer holds it for this consumer (it was handed out again, or is
    /// gone), with why: it is not renewed again.
    Lost(String),
    /// Not renewed, with why; tried again.
    Failed(String),
}

/// When the keeper stops.
pub struct KeeperSignals {
    /// Set by the subscription's close once its pump has ended: finish what is settled,
    /// then stop.
    pub closing: watch::Receiver<bool>,
    /// Set when the subscription stops receiving: from then on a settlement's call is made
    /// at once, so that what the pump read ahead and releases shows again without
    /// lingering.
    pub draining: watch::Receiver<bool>,
    /// Closed when the last settler is gone: nothing more will be settled.
    pub alive: watch::Receiver<()>,
}

/// A subscription's keeper: renews its leases and makes its settlement calls.
pub struct Keeper<K: Keep> {
    keep: K,
    leases: Arc<Leases<K::Data>>,
    /// The queue, as logs name it.
    queue: String,
    lease: Duration,
    /// How long a settlement waits for others to share its call.
    linger: Duration,
    /// The most settlements (and leases due) one call takes.
    batch: usize,
    health: CallHealth,
}

impl<K: Keep> Keeper<K> {
    /// A keeper of `leases` making `keep`'s calls, as `options` say; renewal and
    /// settlement calls mark `health`.
    pub fn new(
        keep: K,
        leases: Arc<Leases<K::Data>>,
        options: &PullOptions,
        health: CallHealth,
    ) -> Self {
        Keeper {
            keep,
            leases,
            queue: options.queue.clone(),
            lease: options.lease,
            linger: options.settle_linger,
            batch: options.settle_batch.max(1),
            health,
        }
    }

    /// Runs until the subscription is closed (or every settler is gone) and every message
    /// is finished with, renewing and settling side by side; then makes the
    /// [`finished`](Keep::finished) call.
    ///
    /// The settlements are made here, on the task that polls this (the mount's own, when
    /// the dispatcher adopts the subscription's [`Background`](crate::Background)); the
    /// renewals on a task of their own, so that a handler that holds its thread longer
    /// than it should does not hold the renewals of the others' leases up too.
    pub async fn run(self, signals: KeeperSignals) {
        let KeeperSignals {
            mut closing,
            draining,
            mut alive,
        } = signals;
        let keeper = Arc::new(self);
        let renewing = AbortOnDrop(tokio::spawn({
            let keeper = keeper.clone();
            async move { keeper.renew_every_tick().await }
        }));
        keeper
            .settle_until_closed(&mut closing, draining, &mut alive)
            .await;
        drop(renewing);
        keeper.keep.finished().await;
    }

    /// Every third of the lease, renews the leases that lapse within half of it. Never
    /// ends.
    ///
    /// A renewal that failed is tried again soon, after a pause doubling from 100 ms, not
    /// at the next tick: a lease due now lapses in a sixth to a half of the lease, so a
    /// tick later the message may already have been handed out again. Once the pauses
    /// would add up to half a tick, the ticks take over (a failure that lasts, a
    /// permission missing say, costs a few calls a tick, not one every 100 ms).
    async fn renew_every_tick(&self) {
        let tick = (self.lease / 3).max(Duration::from_millis(200));
        let mut renewals = tokio::time::interval_at(Instant::now() + tick, tick);
        renewals.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            renewals.tick().await;
            let (mut pause, mut paused) = (RetryPause::new(), Duration::ZERO);
            while !self.renew(pause.failures() > 0).await {
                let wait = pause.failed();
                paused = paused.saturating_add(wait);
                if paused >= tick / 2 {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// Carries out the settlements as they come, until the close (or every settler gone)
    /// and every message is finished with. A settlement waits up to `linger` for a batch
    /// to share its call (not once the subscription drains or closes, nor once those
    /// waiting would make the room the pump waits for).
    async fn settle_until_closed(
        &self,
        closing_asked: &mut watch::Receiver<bool>,
        mut draining_asked: watch::Receiver<bool>,
        alive: &mut watch::Receiver<()>,
    ) {
        let (mut closing, mut draining) = (false, false);
        let mut room_wanted = self.leases.room_wanted();
        // When the settlements waiting now were first seen: the linger counts from there,
        // not from each turn of the loop.
        let mut first_waiting = None;
        loop {
            if closing && self.leases.is_empty() {
                return;
            }
            let (enough, linger) = if closing || draining {
                (1, Duration::ZERO)
            } else {
                (self.enough(*room_wanted.borrow_and_update()), self.linger)
            };
            tokio::select! {
                () = batch_ready(self.leases.settled(), enough, linger, &mut first_waiting) => {
                    first_waiting = None;
                    self.flush().await;
                }
                () = close_requested(closing_asked, alive), if !closing => {
                    closing = true;
                    first_waiting = None;
                    self.flush().await;
                }
                // A dropped sender is a subscriber gone: draining too.
                () = drain_requested(&mut draining_asked), if !draining => {
                    draining = true;
                    first_waiting = None;
                    self.keep.stopped_receiving().await;
                }
                // The next turn lingers, or not, as the pump now needs.
                () = room_wanted_changed(&mut room_wanted) => {}
            }
        }
    }

    /// How many settlements waiting are worth a call without lingering: a batch, or fewer
    /// when the pump waits for room (under `room_wanted`) and that many would make it.
    fn enough(&self, room_wanted: Option<usize>) -> usize {
        let batch = self.batch;
        let Some(limit) = room_wanted else {
            return batch;
        };
        // A message takes room until the keeper takes its settlement: taking
        // `holding - limit + 1` makes room.
        let to_free = self
            .leases
            .holding()
            .saturating_sub(limit)
            .saturating_add(1);
        to_free.min(batch)
    }

    /// Carries out the oldest settlements recorded so far, a batch, then forgets those
    /// messages. The others stay renewed meanwhile, however long the calls take, and so
    /// do these while they are prepared.
    async fn flush(&self) {
        let taken = self.leases.take_settled(self.batch, K::draw);
        if taken.is_empty() {
            return;
        }
        let tags: Vec<u64> = taken.iter().map(|taken| taken.tag).collect();
        let prepared = self.keep.prepare(taken).await;
        self.leases.sending(&tags);
        self.leases.renewals_over(&tags).await;
        if self.keep.settle(prepared).await {
            self.health.succeeded();
        } else {
            self.health.failed();
        }
        self.leases.finish(tags);
    }

    /// Renews the leases close to lapsing: held, or settled with their call not sent yet
    /// (one whose call is going out is left out: that call has the last word). Whether
    /// every renewal due was made (or the lease is lost). A `retry` logs its failures at
    /// DEBUG: the first try of the tick warned already.
    ///
    /// The calls go out side by side: one that gets no answer must not hold the others'
    /// messages up until they show.
    async fn renew(&self, retry: bool) -> bool {
        let due = self.leases.due(self.lease / 2, |tag, data, times| {
            Some((tag, self.keep.renewal(tag, data, times)?))
        });
        let calls = due.chunks(self.batch).map(|chunk| async move {
            let held = self.leases.claim_for_renewal(chunk, |(tag, _)| *tag);
            if held.is_empty() {
                return true;
            }
            // Released however the call ends, a transport's `renew` that panics
            // included: a settlement of one of these waits for the release.
            let _claim = Claim {
                leases: &self.leases,
                tags: held.iter().map(|(tag, _)| *tag).collect(),
            };
            self.renew_held(&held, retry).await
        });
        join_all(calls).await.into_iter().all(|renewed| renewed)
    }

    /// How long a renewal call may go unanswered before it is given up and tried again: a
    /// twelfth of the lease (at least 1 s), half of the least a lease due has left. A
    /// client's own limit is often much longer, by when a lease due has long lapsed.
    fn patience(&self) -> Duration {
        (self.lease / 12).max(Duration::from_secs(1))
    }

    /// One renewal call for `held`, claimed for it. Whether every renewal was made, or the
    /// lease is lost.
    async fn renew_held(&self, held: &[&(u64, K::Renewal)], retry: bool) -> bool {
        let renewals: Vec<&K::Renewal> = held.iter().map(|(_, renewal)| renewal).collect();
        let patience = self.patience();
        let queue = self.queue.as_str();
        let outcomes = match tokio::time::timeout(patience, self.keep.renew(&renewals, retry)).await
        {
            Ok(Ok(outcomes)) => {
                self.health.succeeded();
                outcomes
            }
            Ok(Err(error)) => {
                self.renewal_call_failed(&error, retry);
                return false;
            }
            Err(_) => {
                self.renewal_call_failed(&format_args!("no answer within {patience:?}"), retry);
                return false;
            }
        };
        let mut renewed_all = true;
        for (index, (tag, _)) in held.iter().enumerate() {
            match outcomes.get(index) {
                Some(Renewed::Until(until)) => self.leases.renewed(*tag, *until),
                Some(Renewed::Lost(reason)) => {
                    self.leases.lost(*tag);
                    tracing::warn!(
                        queue,
                        reason,
                        "lease not renewed: the broker no longer holds the message for this consumer (it was handed out again while its handler runs, or is gone)"
                    );
                }
                Some(Renewed::Failed(reason)) => {
                    renewed_all = false;
                    if retry {
                        tracing::debug!(queue, reason, "lease not renewed; trying again");
                    } else {
                        tracing::warn!(queue, reason, "lease not renewed; trying again");
                    }
                }
                None => {
                    renewed_all = false;
                    tracing::warn!(
                        queue,
                        "the renewal call did not answer for every lease; trying again"
                    );
                }
            }
        }
        renewed_all
    }

    /// Counts and logs a renewal call that failed as a whole; a `retry` at DEBUG.
    fn renewal_call_failed(&self, error: &dyn std::fmt::Display, retry: bool) {
        self.health.failed();
        let queue = self.queue.as_str();
        if retry {
            tracing::debug!(queue, %error, "cannot renew leases; trying again");
        } else {
            tracing::warn!(queue, %error, "cannot renew leases; trying again");
        }
    }
}

/// Leases claimed for a renewal call, released when dropped.
struct Claim<'a, D> {
    leases: &'a Leases<D>,
    tags: Vec<u64>,
}

impl<D> Drop for Claim<'_, D> {
    fn drop(&mut self) {
        self.leases.renewal_over(self.tags.drain(..));
    }
}

/// Aborts its task when dropped: the renewals end with the settlements, however those
/// end.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits until the settlements waiting in `queue` are worth a call: `enough` of them, or
/// `linger` after the first was seen, at `first_waiting` (kept by the caller, so that a
/// wait cut short and started again does not start the linger again).
async fn batch_ready<T>(
    queue: &SettleQueue<T>,
    enough: usize,
    linger: Duration,
    first_waiting: &mut Option<Instant>,
) {
    if !queue.ready(1, Duration::ZERO).await {
        return;
    }
    let first = *first_waiting.get_or_insert_with(Instant::now);
    queue
        .ready(enough, linger.saturating_sub(first.elapsed()))
        .await;
}

/// Resolves once the pump starts or stops waiting for room (never, once the leases are
/// gone).
async fn room_wanted_changed(room_wanted: &mut watch::Receiver<Option<usize>>) {
    if room_wanted.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves once the subscription stops receiving (or is gone).
async fn drain_requested(draining: &mut watch::Receiver<bool>) {
    let _ = draining.wait_for(|stop| *stop).await;
}

/// Resolves once the close asks the keeper to finish, or the last settler is gone.
async fn close_requested(closing: &mut watch::Receiver<bool>, alive: &mut watch::Receiver<()>) {
    let asked = async {
        if closing.wait_for(|closing| *closing).await.is_err() {
            // The subscriber was dropped without closing: wait for the settlers instead.
            std::future::pending::<()>().await;
        }
    };
    let settlers_gone = async { while alive.changed().await.is_ok() {} };
    tokio::select! {
        () = asked => {}
        () = settlers_gone => {}
    }
}

#[cfg(test)]
mod tests;
