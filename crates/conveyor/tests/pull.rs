//! The transport kit's pulling subscription under a running app: where its pump and its
//! keeper run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use conveyor::kit::{
    Keep, LeaseTimes, PullOptions, PullSubscriber, Receive, ReceiveFailed, Received, Renewed, Taken,
};
use conveyor::{App, Error, Json, Source, State, SubscribeSettings};
use tokio::sync::{Notify, watch};
use tokio::task::Id;

/// The tasks each side ran on.
#[derive(Clone, Default)]
struct Seen {
    handlers: Arc<Mutex<Vec<Id>>>,
    receives: Arc<Mutex<Vec<Id>>>,
    settlements: Arc<Mutex<Vec<Id>>>,
    renewals: Arc<Mutex<Vec<Id>>>,
    /// Notified at each renewal call.
    renewed: Arc<Notify>,
    /// Notified at each handler run and settlement call.
    progress: Arc<Notify>,
}

fn note(ids: &Mutex<Vec<Id>>) {
    ids.lock().unwrap().push(tokio::task::id());
}

fn ids(ids: &Mutex<Vec<Id>>) -> Vec<Id> {
    ids.lock().unwrap().clone()
}

/// A queue of `messages` payloads, pulled one per receive.
struct Scripted {
    messages: VecDeque<Bytes>,
    seen: Seen,
    /// A renewal is due soon after a receive.
    lease: Duration,
}

struct ScriptedReceive {
    messages: VecDeque<Bytes>,
    lease: Duration,
    seen: Seen,
    /// Set once the subscription stops receiving: a receive of an empty queue ends then.
    stopped: watch::Receiver<bool>,
}

impl Receive for ScriptedReceive {
    type Data = ();

    async fn receive(&mut self, into: &mut Received<'_, ()>) -> Result<(), ReceiveFailed> {
        note(&self.seen.receives);
        let Some(payload) = self.messages.pop_front() else {
            let _ = self.stopped.wait_for(|stopped| *stopped).await;
            return Ok(());
        };
        let tag = into.hold((), self.lease);
        into.push(into.delivery(tag, payload));
        Ok(())
    }
}

struct ScriptedKeep {
    lease: Duration,
    seen: Seen,
    stopped: watch::Sender<bool>,
}

impl Keep for ScriptedKeep {
    type Data = ();
    type Renewal = ();
    type Drawn = ();
    type Prepared = usize;

    fn renewal(&self, _: u64, (): &(), _: LeaseTimes) -> Option<()> {
        Some(())
    }

    async fn renew(&self, due: &[&()], _: bool) -> Result<Vec<Renewed>, String> {
        note(&self.seen.renewals);
        self.seen.renewed.notify_waiters();
        let until = tokio::time::Instant::now() + self.lease;
        Ok(due.iter().map(|_| Renewed::Until(until)).collect())
    }

    fn draw((): &mut ()) {}

    async fn prepare(&self, taken: Vec<Taken<()>>) -> usize {
        taken.len()
    }

    async fn settle(&self, _: usize) -> bool {
        note(&self.seen.settlements);
        self.seen.progress.notify_waiters();
        true
    }

    async fn stopped_receiving(&self) {
        self.stopped.send_replace(true);
    }
}

impl Source for Scripted {
    type Subscriber = PullSubscriber;

    fn queue_name(&self) -> &str {
        "scripted"
    }

    async fn subscribe(self, settings: SubscribeSettings) -> Result<PullSubscriber, Error> {
        let (stopped_tx, stopped) = watch::channel(false);
        let receive = ScriptedReceive {
            messages: self.messages,
            lease: self.lease,
            seen: self.seen.clone(),
            stopped,
        };
        let keep = ScriptedKeep {
            lease: self.lease,
            seen: self.seen,
            stopped: stopped_tx,
        };
        let options = PullOptions {
            queue: "scripted".into(),
            lease: self.lease,
            receive_batch: 1,
            receive_bound: Duration::from_secs(60),
            settle_linger: Duration::ZERO,
            settle_batch: 10,
        };
        Ok(PullSubscriber::start(receive, keep, options, &settings))
    }
}

/// The first handler waits for a renewal of its lease, so that one is made while it runs.
async fn handle(Json(_): Json<u64>, State(seen): State<Seen>) {
    let renewed = seen.renewed.notified();
    let first = seen.handlers.lock().unwrap().is_empty();
    note(&seen.handlers);
    seen.progress.notify_waiters();
    if first {
        renewed.await;
    }
}

/// A sequential mount on a pulling subscription runs its receives and settlement calls
/// on the mount's own task, the one its handler runs on, so that handing a delivery over
/// wakes no other task; the renewals, which must go on whatever a handler does with its
/// thread, run on a task of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulling_subscription_receives_and_settles_on_the_mounts_own_task_and_renews_on_another()
{
    let seen = Seen::default();
    let source = Scripted {
        messages: (0..20).map(|n| Bytes::from(n.to_string())).collect(),
        seen: seen.clone(),
        lease: Duration::from_millis(600),
    };
    let app = App::new("pull")
        .with_state(seen.clone())
        .mount(source, handle, |m| m)
        .start()
        .await
        .unwrap();
    let handled_and_settled = conveyor::kit::wait_for(&seen.progress, || {
        (ids(&seen.handlers).len() >= 20 && !ids(&seen.settlements).is_empty()).then_some(())
    });
    tokio::time::timeout(Duration::from_secs(60), handled_and_settled)
        .await
        .expect("20 deliveries handled and settled");
    app.shutdown().await.unwrap();

    let mount = ids(&seen.handlers)[0];
    assert!(ids(&seen.handlers).iter().all(|id| *id == mount));
    let receives = ids(&seen.receives);
    assert!(receives.len() >= 20, "{} receives", receives.len());
    assert!(
        receives.iter().all(|id| *id == mount),
        "every receive on the mount's task"
    );
    let settlements = ids(&seen.settlements);
    assert!(
        settlements.iter().all(|id| *id == mount),
        "every settlement call on the mount's task"
    );
    let renewals = ids(&seen.renewals);
    assert!(!renewals.is_empty(), "the first lease was renewed");
    assert!(
        renewals.iter().all(|id| *id != mount),
        "renewals on a task of their own"
    );
}
