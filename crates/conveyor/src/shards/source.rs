//! [`Shards`]: one source over several shard queues, holding those a plan gives it.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::select_all;
use tokio::sync::{Notify, watch};
use tokio::task::{Id, JoinSet};

use super::{HeldShards, ShardPlan};
use crate::delivery::{Delivery, Settle, Settled};
use crate::error::Error;
use crate::transport::{
    QueueDescription, ShardsProbe, SharedPublisher, Source, SubscribeSettings, Subscriber,
};

/// How long a shard whose subscription ended waits before it is opened again, so that a
/// subscription that keeps ending does not spin.
const REOPEN_PAUSE: Duration = Duration::from_secs(1);
/// The first and the longest pause between attempts to open a shard's subscription.
const OPEN_RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(5));

/// A [`Source`] over shard queues (`sources[i]` is shard `i`) that holds the shards its
/// [`ShardPlan`] gives this replica, and hands over the others (see the
/// [module docs](super)).
///
/// ```
/// use conveyor::{App, Json, MemoryBroker, shards};
///
/// async fn handle(Json(n): Json<u64>) {}
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = MemoryBroker::new();
/// let queues = (0..4).map(|i| broker.queue(&format!("orders.{i}"))).collect();
/// // A membership (the transport's) sets the plan; here, by hand.
/// let (sender, plan) = shards::plan();
/// sender.set(vec![0, 2]);
/// let app = App::new("orders")
///     .mount(shards::Shards::new("orders", queues, plan), handle, |m| m.workers(4).by_key())
///     .start()
///     .await?;
/// app.shutdown().await
/// # }
/// ```
#[derive(Debug)]
pub struct Shards<S> {
    name: String,
    sources: Vec<S>,
    plan: ShardPlan,
}

impl<S: Source + Clone + Sync> Shards<S> {
    /// A source named `name` (for logs and the app's views) over `sources`, shard `i`
    /// being `sources[i]`, following `plan`. Shards the plan names beyond the sources
    /// are ignored.
    pub fn new(name: impl Into<String>, sources: Vec<S>, plan: ShardPlan) -> Self {
        Shards {
            name: name.into(),
            sources,
            plan,
        }
    }
}

impl<S: Source + Clone + Sync> Source for Shards<S> {
    type Subscriber = ShardsSubscriber<S>;

    fn queue_name(&self) -> &str {
        &self.name
    }

    fn messaging_system(&self) -> &'static str {
        self.sources
            .first()
            .map_or("conveyor", Source::messaging_system)
    }

    fn publisher(&self) -> Option<SharedPublisher> {
        self.sources.first().and_then(Source::publisher)
    }

    fn describe(&self, queue: &str) -> QueueDescription {
        self.sources
            .first()
            .map(|source| source.describe(queue))
            .unwrap_or_default()
    }

    /// Opens nothing yet: each shard's subscription is opened when the plan gives it.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a source over no shard.
    async fn subscribe(self, settings: SubscribeSettings) -> Result<Self::Subscriber, Error> {
        if self.sources.is_empty() {
            return Err(Error::config(format!(
                "the shards `{}` have no queue to subscribe to",
                self.name
            )));
        }
        Ok(ShardsSubscriber {
            name: self.name,
            sources: self.sources,
            settings,
            wanted: self.plan.wanted,
            plan_open: true,
            held: self.plan.held,
            active: Vec::new(),
            opening: JoinSet::new(),
            opening_ids: BTreeMap::new(),
            closing: JoinSet::new(),
            closing_ids: BTreeMap::new(),
            ended: BTreeSet::new(),
            turn: 0,
            stopped: false,
            dirty: true,
        })
    }
}

/// The subscriber of [`Shards`]: the deliveries of every shard held, merged.
pub struct ShardsSubscriber<S: Source> {
    name: String,
    sources: Vec<S>,
    settings: SubscribeSettings,
    wanted: watch::Receiver<Vec<usize>>,
    /// Cleared once the plan's sender is gone: the plan stays as it last was.
    plan_open: bool,
    held: HeldShards,
    active: Vec<Active<S::Subscriber>>,
    opening: JoinSet<(usize, S::Subscriber)>,
    opening_ids: BTreeMap<Id, usize>,
    /// Shards being drained, then closed.
    closing: JoinSet<usize>,
    closing_ids: BTreeMap<Id, usize>,
    /// Shards whose subscription ended by itself, to open again after a pause.
    ended: BTreeSet<usize>,
    /// Which shard's receive is polled first, turning, so no shard starves the others.
    turn: usize,
    stopped: bool,
    /// Set when the plan or a shard's state changed since the last reconcile, so that a
    /// delivery costs no comparison of the plan with what is held.
    dirty: bool,
}

impl<S: Source> std::fmt::Debug for ShardsSubscriber<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardsSubscriber")
            .field("name", &self.name)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

/// One shard's open subscription.
struct Active<T> {
    shard: usize,
    subscriber: T,
    outstanding: Arc<Outstanding>,
    /// The transport's settler last seen and its wrapper, reused while the transport
    /// keeps one settler per subscription (as they do), so that wrapping costs no
    /// allocation per delivery.
    wrapped: Option<(Arc<dyn Settle>, Arc<dyn Settle>)>,
}

/// How many of a shard's deliveries are handed out and not settled yet.
#[derive(Debug, Default)]
struct Outstanding {
    count: AtomicUsize,
    none_left: Notify,
}

impl Outstanding {
    fn settled_one(&self) {
        let before = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or(0);
        if before <= 1 {
            self.none_left.notify_waiters();
        }
    }

    /// Resolves once every delivery handed out is settled.
    async fn drained(&self) {
        loop {
            let notified = self.none_left.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// The settler a shard's deliveries carry: the transport's, counted.
struct Counted {
    inner: Arc<dyn Settle>,
    outstanding: Arc<Outstanding>,
}

impl Settle for Counted {
    fn settle(&self, settled: Settled<'_>) {
        // The transport takes the settlement first, so that once the count is zero every
        // settlement is with it, and closing the subscription flushes them.
        self.inner.settle(settled);
        self.outstanding.settled_one();
    }

    fn record(&self, tag: u64) -> Option<Box<dyn std::any::Any + Send>> {
        self.inner.record(tag)
    }
}

enum Event<T> {
    Opened(Option<(usize, T)>, Id),
    Closed(Id),
    Plan { open: bool },
    Received(usize, Option<Result<Delivery, Error>>),
}

impl<S: Source + Clone + Sync> ShardsSubscriber<S> {
    /// Opens the shards the plan gives and are not open, and gives up those it no
    /// longer gives.
    fn reconcile(&mut self) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        let count = self.sources.len();
        let wanted: BTreeSet<usize> = if self.stopped {
            BTreeSet::new()
        } else {
            self.wanted
                .borrow_and_update()
                .iter()
                .copied()
                .filter(|&shard| shard < count)
                .collect()
        };
        let (keep, give_up): (Vec<_>, Vec<_>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|active| wanted.contains(&active.shard));
        self.active = keep;
        for active in give_up {
            self.give_up(active);
        }
        for &shard in &wanted {
            let busy = self.active.iter().any(|active| active.shard == shard)
                || self.opening_ids.values().any(|&s| s == shard)
                || self.closing_ids.values().any(|&s| s == shard);
            if busy {
                continue;
            }
            let Some(source) = self.sources.get(shard).cloned() else {
                continue;
            };
            let pause = if self.ended.remove(&shard) {
                REOPEN_PAUSE
            } else {
                Duration::ZERO
            };
            let settings = self.settings.clone();
            let name = self.name.clone();
            let handle = self
                .opening
                .spawn(open(source, settings, shard, pause, name));
            self.opening_ids.insert(handle.id(), shard);
        }
    }

    /// Stops handing out `active`'s deliveries; closes its subscription once every one
    /// handed out is settled, so that what it read ahead goes back to the queue only
    /// when nothing of the shard is left running here.
    fn give_up(&mut self, active: Active<S::Subscriber>) {
        let Active {
            shard,
            subscriber,
            outstanding,
            ..
        } = active;
        tracing::info!(shards = %self.name, shard, "giving the shard up: draining it");
        let name = self.name.clone();
        let handle = self.closing.spawn(async move {
            outstanding.drained().await;
            subscriber.close().await;
            tracing::info!(shards = %name, shard, "shard given up");
            shard
        });
        self.closing_ids.insert(handle.id(), shard);
    }

    async fn next_event(&mut self) -> Event<S::Subscriber> {
        let ShardsSubscriber {
            wanted,
            plan_open,
            active,
            opening,
            closing,
            turn,
            ..
        } = self;
        let start = *turn;
        *turn = turn.wrapping_add(1);
        let receiving = async move {
            if active.is_empty() {
                return std::future::pending().await;
            }
            type Receive<'a> =
                Pin<Box<dyn Future<Output = (usize, Option<Result<Delivery, Error>>)> + Send + 'a>>;
            let mut receives: Vec<Receive<'_>> = active
                .iter_mut()
                .enumerate()
                .map(|(at, active)| {
                    Box::pin(async move { (at, active.subscriber.recv().await) }) as Receive<'_>
                })
                .collect();
            let len = receives.len();
            receives.rotate_left(start % len);
            let ((at, got), _, _) = select_all(receives).await;
            (at, got)
        };
        tokio::select! {
            Some(joined) = opening.join_next_with_id(), if !opening.is_empty() => match joined {
                Ok((id, opened)) => Event::Opened(Some(opened), id),
                Err(error) => Event::Opened(None, error.id()),
            },
            Some(joined) = closing.join_next_with_id(), if !closing.is_empty() => match joined {
                Ok((id, _)) => Event::Closed(id),
                Err(error) => Event::Closed(error.id()),
            },
            changed = wanted.changed(), if *plan_open => Event::Plan { open: changed.is_ok() },
            (at, got) = receiving => Event::Received(at, got),
        }
    }
}

/// Opens `source`'s subscription after `pause`, trying again until it opens: a shard
/// that cannot be opened now (its queue missing, the connection down) is retried, and
/// the others go on meanwhile.
async fn open<S: Source + Clone>(
    source: S,
    settings: SubscribeSettings,
    shard: usize,
    pause: Duration,
    name: String,
) -> (usize, S::Subscriber) {
    tokio::time::sleep(pause).await;
    let mut wait = OPEN_RETRY.0;
    loop {
        match source.clone().subscribe(settings.clone()).await {
            Ok(subscriber) => return (shard, subscriber),
            Err(error) => {
                tracing::warn!(shards = %name, shard, error = %crate::Report(&error), ?wait, "opening the shard failed; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(OPEN_RETRY.1);
            }
        }
    }
}

/// Whether `a` and `b` are the same object (compared by address, not by vtable, which
/// may differ for one type between codegen units).
fn same(a: &Arc<dyn Settle>, b: &Arc<dyn Settle>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl<S: Source + Clone + Sync> Subscriber for ShardsSubscriber<S> {
    async fn recv(&mut self) -> Option<Result<Delivery, Error>> {
        loop {
            self.reconcile();
            let event = self.next_event().await;
            if !matches!(event, Event::Received(_, Some(_))) {
                self.dirty = true;
            }
            match event {
                Event::Opened(opened, id) => {
                    let shard = self.opening_ids.remove(&id);
                    let Some((shard, subscriber)) = opened else {
                        tracing::warn!(shards = %self.name, ?shard, "opening a shard panicked");
                        continue;
                    };
                    let active = Active {
                        shard,
                        subscriber,
                        outstanding: Arc::default(),
                        wrapped: None,
                    };
                    self.held.insert(shard);
                    if !self.stopped && self.wanted.borrow().contains(&shard) {
                        tracing::info!(shards = %self.name, shard, "holding the shard");
                        self.active.push(active);
                    } else {
                        // The plan changed while it was opening.
                        self.give_up(active);
                    }
                }
                Event::Closed(id) => {
                    if let Some(shard) = self.closing_ids.remove(&id) {
                        self.held.remove(shard);
                    }
                }
                Event::Plan { open } => self.plan_open = open,
                Event::Received(at, Some(Ok(mut delivery))) => {
                    let Some(active) = self.active.get_mut(at) else {
                        continue;
                    };
                    let outstanding = &active.outstanding;
                    let cache = &mut active.wrapped;
                    let counted = delivery.wrap_settler(|inner| {
                        if let Some((seen, wrapped)) = cache
                            && same(seen, inner)
                        {
                            return wrapped.clone();
                        }
                        let wrapped: Arc<dyn Settle> = Arc::new(Counted {
                            inner: inner.clone(),
                            outstanding: outstanding.clone(),
                        });
                        *cache = Some((inner.clone(), wrapped.clone()));
                        wrapped
                    });
                    if counted {
                        outstanding.count.fetch_add(1, Ordering::AcqRel);
                    }
                    return Some(Ok(delivery));
                }
                Event::Received(_, Some(Err(error))) => return Some(Err(error)),
                Event::Received(at, None) => {
                    if at < self.active.len() {
                        let active = self.active.remove(at);
                        tracing::warn!(shards = %self.name, shard = active.shard, "the shard's subscription ended; opening it again");
                        self.ended.insert(active.shard);
                        self.give_up(active);
                    }
                }
            }
        }
    }

    fn shards(&self) -> Option<Arc<dyn ShardsProbe>> {
        Some(Arc::new(self.held.clone()))
    }

    /// Hands out nothing more, but keeps every shard's subscription, read-ahead
    /// included, until [`close`](Subscriber::close): releasing the read-ahead now would
    /// let the next holder of a shard take later messages while this replica's handlers
    /// still run earlier ones of the same keys. The broker gives a shard's next holder
    /// nothing while this one's subscription is open anyway (single active consumer), so
    /// releasing early would gain nothing.
    async fn stop_receiving(&mut self) {
        self.stopped = true;
        self.dirty = true;
    }

    async fn close(mut self) {
        self.stopped = true;
        for active in std::mem::take(&mut self.active) {
            self.give_up(active);
        }
        while let Some(joined) = self.opening.join_next().await {
            if let Ok((shard, subscriber)) = joined {
                self.give_up(Active {
                    shard,
                    subscriber,
                    outstanding: Arc::default(),
                    wrapped: None,
                });
            }
        }
        while self.closing.join_next().await.is_some() {}
        self.opening_ids.clear();
        self.closing_ids.clear();
        *crate::kit::lock(&self.held.0) = Vec::new();
    }
}

impl ShardsProbe for HeldShards {
    fn held(&self) -> Vec<usize> {
        self.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryBroker, Message, Publisher, Settlement};

    async fn idle_recv<T: Subscriber>(subscriber: &mut T) {
        let got = tokio::time::timeout(Duration::from_millis(100), subscriber.recv()).await;
        assert!(got.is_err(), "nothing was published");
    }

    #[tokio::test]
    async fn a_shard_given_up_stays_open_until_its_deliveries_are_settled() {
        let broker = MemoryBroker::new();
        let queues = (0..2).map(|i| broker.queue(format!("s.{i}"))).collect();
        let (sender, plan) = super::super::plan();
        sender.set(vec![0, 1]);
        let mut subscriber = Shards::new("s", queues, plan)
            .subscribe(SubscribeSettings::new(4))
            .await
            .unwrap();
        idle_recv(&mut subscriber).await;
        broker.publish("s.0", Message::new("a")).await.unwrap();
        let delivery = subscriber.recv().await.unwrap().unwrap();
        assert_eq!(delivery.queue(), "s.0");
        assert_eq!(sender.held(), [0, 1]);

        sender.set(vec![1]);
        idle_recv(&mut subscriber).await;
        assert_eq!(sender.held(), [0, 1], "shard 0 is drained before it closes");

        delivery.settle(Settlement::Ack);
        idle_recv(&mut subscriber).await;
        assert_eq!(sender.held(), [1]);
        subscriber.close().await;
        assert!(sender.held().is_empty());
    }

    #[tokio::test]
    async fn health_and_the_lanes_view_show_the_shards_a_mount_holds() {
        use crate::{App, Json};
        async fn handle(Json(_): Json<u64>) {}
        let broker = MemoryBroker::new();
        let queues = (0..4).map(|i| broker.queue(format!("h.{i}"))).collect();
        let (sender, plan) = super::super::plan();
        sender.set(vec![3, 1]);
        let app = App::new("h")
            .mount(Shards::new("h", queues, plan), handle, |m| {
                m.workers(2).by_key()
            })
            .start()
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while app.health().mounts[0].shards != Some(vec![1, 3]) {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", app.health());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(app.lanes()[0].shards, Some(vec![1, 3]));
        app.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_shard_the_plan_gives_later_is_opened_and_its_deliveries_merged() {
        let broker = MemoryBroker::new();
        let queues = (0..3).map(|i| broker.queue(format!("t.{i}"))).collect();
        let (sender, plan) = super::super::plan();
        let mut subscriber = Shards::new("t", queues, plan)
            .subscribe(SubscribeSettings::new(4))
            .await
            .unwrap();
        broker.publish("t.2", Message::new("x")).await.unwrap();
        idle_recv(&mut subscriber).await;
        assert!(sender.held().is_empty(), "an empty plan holds nothing");

        sender.set(vec![2, 7]);
        let delivery = subscriber.recv().await.unwrap().unwrap();
        assert_eq!(delivery.queue(), "t.2");
        assert_eq!(sender.held(), [2], "a shard beyond the queues is ignored");
        drop(delivery);
        subscriber.stop_receiving().await;
        subscriber.close().await;
    }
}
