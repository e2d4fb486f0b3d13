//! The keeper against a scripted broker: when it renews, and in what order its
//! renewals and settlements reach the broker.
use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Semaphore;

use super::*;
use crate::kit::pull::Alive;

/// What reached the scripted broker, with the instant it did.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Renew(Vec<&'static str>),
    Settle(Vec<(&'static str, &'static str)>),
}

#[derive(Clone, Default)]
struct Script {
    calls: Arc<Mutex<Vec<(Instant, Call)>>>,
    /// What the next renewal calls answer as a whole (`false`: fails), then success.
    renewals_fail: Arc<Mutex<VecDeque<bool>>>,
    /// When set, a renewal call waits for a permit before it answers.
    renewal_gate: Option<Arc<Semaphore>>,
}

const LEASE: Duration = Duration::from_secs(30);

impl Keep for Script {
    type Data = &'static str;
    type Op = &'static str;
    type Renewal = &'static str;
    type Drawn = &'static str;
    type Prepared = Vec<(&'static str, &'static str)>;

    fn queue(&self) -> &str {
        "q"
    }
    fn lease(&self) -> Duration {
        LEASE
    }
    fn batch(&self) -> usize {
        10
    }
    fn renewal(&self, _: u64, name: &&'static str, _: LeaseTimes) -> Option<&'static str> {
        Some(name)
    }
    async fn renew(&self, due: &[&&'static str], _: bool) -> Result<Vec<Renewed>, String> {
        if let Some(gate) = &self.renewal_gate
            && let Ok(permit) = gate.acquire().await
        {
            permit.forget();
        }
        let names = due.iter().map(|name| **name).collect();
        self.calls
            .lock()
            .unwrap()
            .push((Instant::now(), Call::Renew(names)));
        if self.renewals_fail.lock().unwrap().pop_front() == Some(false) {
            return Err("refused".into());
        }
        Ok(due
            .iter()
            .map(|_| Renewed::Until(Instant::now() + LEASE))
            .collect())
    }
    fn draw(name: &mut &'static str) -> &'static str {
        name
    }
    async fn prepare(&self, taken: Vec<Taken<&'static str, &'static str>>) -> Self::Prepared {
        taken
            .into_iter()
            .map(|taken| (taken.data, taken.op))
            .collect()
    }
    async fn settle(&self, prepared: Self::Prepared) {
        self.calls
            .lock()
            .unwrap()
            .push((Instant::now(), Call::Settle(prepared)));
    }
}

struct Running {
    leases: Arc<Leases<&'static str, &'static str>>,
    closing: watch::Sender<bool>,
    _draining: watch::Sender<bool>,
    alive: Option<Alive>,
    keeper: tokio::task::JoinHandle<()>,
}

fn start(script: &Script) -> Running {
    start_lingering(script, Duration::from_millis(5))
}

fn start_lingering(script: &Script, linger: Duration) -> Running {
    let leases = Arc::new(Leases::default());
    let (alive, alive_watch) = Alive::new();
    let (closing, closing_watch) = watch::channel(false);
    let (draining, draining_watch) = watch::channel(false);
    let keeper = Keeper::new(
        script.clone(),
        leases.clone(),
        linger,
        CallHealth::default(),
    );
    let keeper = tokio::spawn(keeper.run(KeeperSignals {
        closing: closing_watch,
        draining: draining_watch,
        alive: alive_watch,
    }));
    Running {
        leases,
        closing,
        _draining: draining,
        alive: Some(alive),
        keeper,
    }
}

fn calls(script: &Script, began: Instant) -> Vec<(Duration, Call)> {
    let calls = script.calls.lock().unwrap();
    calls
        .iter()
        .map(|(at, call)| (*at - began, call.clone()))
        .collect()
}

/// With a 30 s lease the keeper ticks every 10 s and renews what lapses within 15 s;
/// a renewal call that fails is made again after 100 ms, 200 ms, ... until the pauses
/// would pass half a tick, then waits for the next tick.
#[tokio::test(start_paused = true)]
async fn a_failing_renewal_is_tried_again_after_doubling_pauses_then_at_the_next_tick() {
    let script = Script::default();
    script
        .renewals_fail
        .lock()
        .unwrap()
        .extend(std::iter::repeat_n(false, 6));
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(running.leases.settle(tag, |_| "ack"));
    let at: Vec<u128> = calls(&script, began)
        .iter()
        .filter(|(_, call)| matches!(call, Call::Renew(_)))
        .map(|(at, _)| at.as_millis())
        .collect();
    // Due at the 20 s tick: the call, then 0.1, 0.2, 0.4, 0.8 and 1.6 s pauses (3.1 s
    // in all; 3.2 more would pass half the tick); then the 30 s tick succeeds.
    assert_eq!(at, [20_000, 20_100, 20_300, 20_700, 21_500, 23_100, 30_000]);
    running.closing.send_replace(true);
    running.keeper.await.unwrap();
}

/// A settlement whose message a renewal call covers waits for that call: its own call
/// reaches the broker after the renewal's, never before.
#[tokio::test(start_paused = true)]
async fn a_settlement_made_during_its_renewal_reaches_the_broker_after_it() {
    let gate = Arc::new(Semaphore::new(0));
    let script = Script {
        renewal_gate: Some(gate.clone()),
        ..Script::default()
    };
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    // The 20 s tick's renewal is under way, held at the gate.
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(running.leases.settle(tag, |_| "ack"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        calls(&script, began).is_empty(),
        "the ack waits for the renewal"
    );
    gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let order: Vec<Call> = calls(&script, began)
        .into_iter()
        .map(|(_, call)| call)
        .collect();
    assert_eq!(
        order,
        [Call::Renew(vec!["a"]), Call::Settle(vec![("a", "ack")])]
    );
    running.closing.send_replace(true);
    running.keeper.await.unwrap();
}

/// Once the last settler is gone the keeper carries out what was settled and ends,
/// even if the subscription is never closed.
#[tokio::test(start_paused = true)]
async fn the_keeper_settles_what_is_left_and_ends_once_every_settler_is_gone() {
    let script = Script::default();
    let mut running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    assert!(running.leases.settle(tag, |_| "release"));
    drop(running.alive.take());
    tokio::time::timeout(Duration::from_secs(60), running.keeper)
        .await
        .expect("the keeper ends")
        .unwrap();
    let calls: Vec<Call> = calls(&script, Instant::now())
        .into_iter()
        .map(|(_, call)| call)
        .collect();
    assert_eq!(calls, [Call::Settle(vec![("a", "release")])]);
    assert!(running.leases.is_empty());
}

/// A settlement lingers for others to share its call, but not once the settlements
/// waiting would make the room the pump waits for: the next receive waits on them.
#[tokio::test(start_paused = true)]
async fn settlements_go_out_at_once_when_they_would_make_the_room_the_pump_waits_for() {
    let script = Script::default();
    let began = Instant::now();
    let running = start_lingering(&script, Duration::from_secs(10));
    let tags = ["a", "b", "c", "d"].map(|name| running.leases.insert(name, LEASE));
    assert!(running.leases.settle(tags[0], |_| "ack"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(calls(&script, began).is_empty(), "lingering for a batch");

    // Four held, the pump waits to hold fewer than three: two must go.
    let leases = running.leases.clone();
    let pump = tokio::spawn(async move { leases.room_for(3).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(calls(&script, began).is_empty(), "one sent makes no room");
    assert!(running.leases.settle(tags[1], |_| "ack"));
    tokio::time::timeout(Duration::from_millis(1), pump)
        .await
        .expect("room once the two acks are sent")
        .unwrap();
    let both = Call::Settle(vec![("a", "ack"), ("b", "ack")]);
    assert_eq!(calls(&script, began), [(Duration::from_secs(2), both)]);

    // No pump waits any more: the next settlement lingers again.
    assert!(running.leases.settle(tags[2], |_| "ack"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(calls(&script, began).len(), 1, "lingering again");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        calls(&script, began).last(),
        Some(&(Duration::from_secs(12), Call::Settle(vec![("c", "ack")])))
    );
    assert!(running.leases.settle(tags[3], |_| "ack"));
    running.closing.send_replace(true);
    running.keeper.await.unwrap();
}
