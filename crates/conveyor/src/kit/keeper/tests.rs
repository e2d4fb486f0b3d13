//! The keeper against a scripted broker: when it renews, and in what order its
//! renewals and settlements reach the broker, and what a call that is slow, fails or
//! never answers holds back.
use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Semaphore;

use super::*;
use crate::kit::settler::Alive;
use crate::kit::verdict::{Rejected, Verdict};

/// What reached the scripted broker.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Renew(Vec<&'static str>),
    Settle(Vec<(&'static str, &'static str)>),
    /// The subscription stopped receiving.
    StoppedReceiving,
    /// The subscription's last call.
    Finished,
}

/// How the scripted broker answers one renewal call.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// Each lease renewed for this long from when the call reached the broker.
    RenewedFor(Duration),
    /// Each lease not renewed, for the keeper to try again.
    Failed,
    /// Each lease no longer held for this consumer.
    Lost,
    /// The call failed as a whole.
    CallFailed,
    /// The call never answers (a connection gone quiet).
    Unanswered,
    /// The transport's renewal panics (a bug).
    Panics,
}

#[derive(Clone, Default)]
struct Script {
    /// Each call, with the instant it reached the broker.
    calls: Arc<Mutex<Vec<(Instant, Call)>>>,
    /// How the next renewal calls answer, in the order they are made; then each
    /// renews for the lease.
    answers: Arc<Mutex<VecDeque<Answer>>>,
    /// When set, a renewal call waits for a permit before it reaches the broker.
    renewal_gate: Option<Arc<Semaphore>>,
    /// When set, a settlement call waits for a permit before it reaches the broker (one
    /// never given: the call hangs).
    settle_gate: Option<Arc<Semaphore>>,
    /// How many settlement calls have started, gate or not.
    settles_started: watch::Sender<usize>,
    /// How long a call takes to answer once it reached the broker.
    latency: Duration,
    /// How long preparing a batch of settlements takes (a dead letter's send, say).
    prepare_latency: Duration,
    /// Whether the settlement calls fail (the broker took none of them).
    settles_fail: bool,
}

const LEASE: Duration = Duration::from_secs(30);

impl Script {
    /// A call that reached the broker now.
    fn record(&self, call: Call) {
        self.calls.lock().unwrap().push((Instant::now(), call));
    }
}

/// Waits for a permit of `gate`, if any.
async fn pass(gate: Option<&Arc<Semaphore>>) {
    if let Some(gate) = gate
        && let Ok(permit) = gate.acquire().await
    {
        permit.forget();
    }
}

/// A verdict as the scripted broker records it.
fn label(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Ack => "ack",
        Verdict::Retry { .. } => "retry",
        Verdict::Reject(_) => "reject",
    }
}

/// A reject's verdict.
fn rejected() -> Verdict {
    Verdict::Reject(Box::new(Rejected {
        reason: "bad".into(),
        attempt: 1,
        payload: bytes::Bytes::new(),
        headers: crate::Headers::new(),
        partition_key: None,
    }))
}

impl Keep for Script {
    type Data = &'static str;
    type Renewal = &'static str;
    type Drawn = &'static str;
    type Prepared = Vec<(&'static str, &'static str)>;

    fn renewal(&self, _: u64, name: &&'static str, _: LeaseTimes) -> Option<&'static str> {
        Some(name)
    }
    async fn renew(&self, due: &[&&'static str], _: bool) -> Result<Vec<Renewed>, String> {
        let answer = self.answers.lock().unwrap().pop_front();
        let answer = answer.unwrap_or(Answer::RenewedFor(LEASE));
        if matches!(answer, Answer::Unanswered) {
            std::future::pending::<()>().await;
        }
        assert!(!matches!(answer, Answer::Panics), "a renewal that panics");
        pass(self.renewal_gate.as_ref()).await;
        let arrived = Instant::now();
        self.record(Call::Renew(due.iter().map(|name| **name).collect()));
        tokio::time::sleep(self.latency).await;
        let each = match answer {
            Answer::RenewedFor(lease) => Renewed::Until(arrived + lease),
            Answer::Failed => Renewed::Failed("busy".into()),
            Answer::Lost => Renewed::Lost("handed out again".into()),
            Answer::CallFailed => return Err("refused".into()),
            Answer::Unanswered | Answer::Panics => unreachable!("never answers"),
        };
        Ok(vec![each; due.len()])
    }
    fn draw(name: &mut &'static str) -> &'static str {
        name
    }
    async fn prepare(&self, taken: Vec<Taken<&'static str>>) -> Self::Prepared {
        tokio::time::sleep(self.prepare_latency).await;
        taken
            .into_iter()
            .map(|taken| (taken.data, label(&taken.verdict)))
            .collect()
    }
    async fn settle(&self, prepared: Self::Prepared) -> bool {
        self.settles_started.send_modify(|started| *started += 1);
        pass(self.settle_gate.as_ref()).await;
        self.record(Call::Settle(prepared));
        tokio::time::sleep(self.latency).await;
        !self.settles_fail
    }
    async fn stopped_receiving(&self) {
        self.record(Call::StoppedReceiving);
    }
    async fn finished(&self) {
        self.record(Call::Finished);
    }
}

struct Running {
    leases: Arc<Leases<&'static str>>,
    closing: watch::Sender<bool>,
    draining: watch::Sender<bool>,
    alive: Option<Alive>,
    keeper: tokio::task::JoinHandle<()>,
    /// Marked by the keeper's calls.
    health: CallHealth,
}

impl Running {
    /// Closes the subscription and waits for the keeper to finish.
    async fn close(self) {
        self.closing.send_replace(true);
        self.keeper.await.unwrap();
    }
}

fn start(script: &Script) -> Running {
    start_lingering(script, Duration::from_millis(5))
}

fn start_lingering(script: &Script, linger: Duration) -> Running {
    let leases = Arc::new(Leases::default());
    let (alive, alive_watch) = Alive::new();
    let (closing, closing_watch) = watch::channel(false);
    let (draining, draining_watch) = watch::channel(false);
    let options = PullOptions {
        queue: "q".into(),
        lease: LEASE,
        receive_batch: 1,
        receive_bound: Duration::from_secs(1),
        settle_linger: linger,
        settle_batch: 10,
    };
    let health = CallHealth::default();
    let keeper = Keeper::new(script.clone(), leases.clone(), &options, health.clone());
    let keeper = tokio::spawn(keeper.run(KeeperSignals {
        closing: closing_watch,
        draining: draining_watch,
        alive: alive_watch,
    }));
    Running {
        leases,
        closing,
        draining,
        alive: Some(alive),
        keeper,
        health,
    }
}

fn calls(script: &Script, began: Instant) -> Vec<(Duration, Call)> {
    let calls = script.calls.lock().unwrap();
    calls
        .iter()
        .map(|(at, call)| (*at - began, call.clone()))
        .collect()
}

/// When renewal calls reached the broker, in milliseconds from `began`.
fn renewals_at(script: &Script, began: Instant) -> Vec<u128> {
    calls(script, began)
        .iter()
        .filter(|(_, call)| matches!(call, Call::Renew(_)))
        .map(|(at, _)| at.as_millis())
        .collect()
}

/// How many settlements the settlement calls carried, in all.
fn settled_count(script: &Script) -> usize {
    calls(script, Instant::now())
        .iter()
        .map(|(_, call)| match call {
            Call::Settle(settled) => settled.len(),
            Call::Renew(_) | Call::StoppedReceiving | Call::Finished => 0,
        })
        .sum()
}

/// With a 30 s lease the keeper ticks every 10 s and renews what lapses within 15 s;
/// a renewal call that fails is made again after 100 ms, 200 ms, ... until the pauses
/// would pass half a tick, then waits for the next tick.
#[tokio::test(start_paused = true)]
async fn a_failing_renewal_is_tried_again_after_doubling_pauses_then_at_the_next_tick() {
    let script = Script::default();
    script
        .answers
        .lock()
        .unwrap()
        .extend([Answer::CallFailed; 6]);
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    // Due at the 20 s tick: the call, then 0.1, 0.2, 0.4, 0.8 and 1.6 s pauses (3.1 s
    // in all; 3.2 more would pass half the tick); then the 30 s tick succeeds.
    assert_eq!(
        renewals_at(&script, began),
        [20_000, 20_100, 20_300, 20_700, 21_500, 23_100, 30_000]
    );
    running.close().await;
}

/// Settlement calls that fail show the queue's calls as failing, until one goes through.
#[tokio::test(start_paused = true)]
async fn failing_settlement_calls_mark_the_queue_as_failing_until_one_succeeds() {
    use crate::ConnectionProbe;

    let failing = Script {
        settles_fail: true,
        ..Script::default()
    };
    let running = start(&failing);
    let tag = running.leases.insert("a", LEASE);
    assert!(running.leases.settle(tag, Verdict::Ack));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        calls(&failing, Instant::now()).len(),
        1,
        "the settlement call was made"
    );
    assert!(running.health.is_lost(), "a failed settlement call shows");
    running.close().await;

    let script = Script::default();
    let running = start(&script);
    running.health.failed();
    let tag = running.leases.insert("a", LEASE);
    assert!(running.leases.settle(tag, Verdict::Ack));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !running.health.is_lost(),
        "a settlement call that went through clears it"
    );
    running.close().await;
}

/// A renewal the broker refused for the lease itself (not the call) is tried again
/// as soon as a failed call is: after 100 ms, then 200 ms, not a tick (10 s) later, when
/// the lease, due with 10 s left, would have lapsed.
#[tokio::test(start_paused = true)]
async fn a_renewal_failed_for_its_lease_is_tried_again_long_before_the_lease_lapses() {
    let script = Script::default();
    script
        .answers
        .lock()
        .unwrap()
        .extend([Answer::CallFailed, Answer::Failed]);
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    running.close().await;
    assert_eq!(renewals_at(&script, began), [20_000, 20_100, 20_300]);
}

/// A renewal that keeps failing (a permission missing, say) warns once a tick: its
/// retries log at DEBUG, so that a failure that lasts does not flood the logs.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_keeps_failing_warns_once_a_tick() {
    let (logs, _capturing) = Logs::capture();
    let script = Script::default();
    script
        .answers
        .lock()
        .unwrap()
        .extend([Answer::CallFailed; 20]);
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    running.close().await;
    assert_eq!(
        renewals_at(&script, began).len(),
        6,
        "the 20 s tick's tries"
    );
    let text = logs.text();
    assert_eq!(text.matches("cannot renew leases").count(), 1, "{text}");
}

/// A lease the broker no longer holds for this consumer is not renewed again: it would
/// fail again, at every tick until the handler ends.
#[tokio::test(start_paused = true)]
async fn a_lease_the_broker_no_longer_holds_is_not_renewed_again() {
    let script = Script::default();
    script.answers.lock().unwrap().push_back(Answer::Lost);
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    running.close().await;
    assert_eq!(renewals_at(&script, began), [20_000]);
}

/// A renewal call that gets no answer (a connection gone quiet) is given up after a
/// twelfth of the lease and made again: the lease, due with 10 s left, is renewed before
/// it lapses, not after a client's own, much longer, limit.
#[tokio::test(start_paused = true)]
async fn a_renewal_call_that_gets_no_answer_is_made_again_before_the_lease_lapses() {
    let (logs, _capturing) = Logs::capture();
    let script = Script::default();
    script.answers.lock().unwrap().push_back(Answer::Unanswered);
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    running.close().await;
    // Unanswered at 20 s, given up at 22.5 s, made again 100 ms later.
    assert_eq!(renewals_at(&script, began), [22_600]);
    let text = logs.text();
    assert!(text.contains("no answer within 2.5s"), "{text}");
}

/// The renewal calls of a tick go out side by side: one that gets no answer holds up
/// none of the other leases' renewals.
#[tokio::test(start_paused = true)]
async fn a_renewal_call_that_gets_no_answer_holds_up_no_other() {
    let script = Script::default();
    script.answers.lock().unwrap().push_back(Answer::Unanswered);
    let began = Instant::now();
    let running = start(&script);
    let tags: Vec<u64> = (0..11).map(|_| running.leases.insert("a", LEASE)).collect();
    tokio::time::sleep(Duration::from_secs(25)).await;
    for tag in tags {
        assert!(running.leases.settle(tag, Verdict::Ack));
    }
    running.close().await;
    let renewals: Vec<(u128, usize)> = calls(&script, began)
        .into_iter()
        .filter_map(|(at, call)| match call {
            Call::Renew(names) => Some((at.as_millis(), names.len())),
            Call::Settle(_) | Call::StoppedReceiving | Call::Finished => None,
        })
        .collect();
    // The first ten's call unanswered; the eleventh renewed at once, the first ten
    // again once their call was given up.
    assert_eq!(renewals, [(20_000, 1), (22_600, 10)]);
}

/// A renewal answers when its lease now lapses, counted from when the broker took the
/// call; the keeper times the next renewal by that, not by a lease from when a slow
/// answer came back.
#[tokio::test(start_paused = true)]
async fn a_renewed_lease_lapses_when_its_renewal_answered_not_a_lease_after_the_answer() {
    let script = Script {
        // Slow, but within the 2.5 s a renewal call is given.
        latency: Duration::from_secs(2),
        ..Script::default()
    };
    // Renewed at 20 s for 20 s, answered at 22 s: it lapses at 40 s, so it is due at
    // the 30 s tick (not at 40 s, as it would be lapsing at 52 s).
    script
        .answers
        .lock()
        .unwrap()
        .push_back(Answer::RenewedFor(Duration::from_secs(20)));
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(55)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    running.close().await;
    assert_eq!(renewals_at(&script, began), [20_000, 30_000, 50_000]);
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
    assert!(running.leases.settle(tag, Verdict::Ack));
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
    running.close().await;
}

/// A transport's renewal that panics (on its own task) leaves the leases it had claimed
/// free for their settlements: the settlement call is made and the keeper finishes.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_panics_holds_no_settlement_up() {
    let script = Script::default();
    script.answers.lock().unwrap().push_back(Answer::Panics);
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    // The 20 s tick's renewal has panicked.
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    tokio::time::timeout(Duration::from_secs(600), running.close())
        .await
        .expect("the keeper finishes");
    let order: Vec<Call> = calls(&script, began)
        .into_iter()
        .map(|(_, call)| call)
        .collect();
    assert_eq!(order, [Call::Settle(vec![("a", "ack")]), Call::Finished]);
}

/// A message settled, and its call made, before its renewal is due is not renewed.
#[tokio::test(start_paused = true)]
async fn a_message_settled_before_its_renewal_is_not_renewed() {
    let script = Script::default();
    let began = Instant::now();
    let running = start(&script);
    let held = running.leases.insert("held", LEASE);
    let settled = running.leases.insert("settled", LEASE);
    assert!(
        running
            .leases
            .settle(settled, Verdict::Retry { after: None })
    );
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert_eq!(
        calls(&script, began),
        [
            (
                Duration::from_millis(5),
                Call::Settle(vec![("settled", "retry")])
            ),
            (Duration::from_secs(20), Call::Renew(vec!["held"])),
        ]
    );
    assert!(running.leases.settle(held, Verdict::Ack));
    running.close().await;
}

/// A settlement call that hangs holds up no renewal: the leases held, and those
/// settled behind the hanging call, stay renewed.
#[tokio::test(start_paused = true)]
async fn renewals_go_on_while_a_settlement_call_hangs() {
    let script = Script {
        settle_gate: Some(Arc::new(Semaphore::new(0))),
        ..Script::default()
    };
    let running = start(&script);
    let acked = running.leases.insert("acked", LEASE);
    running.leases.insert("held", LEASE);
    let acked_later = running.leases.insert("acked later", LEASE);
    assert!(running.leases.settle(acked, Verdict::Ack));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Settled while the first ack's call hangs: its own call waits behind it.
    assert!(running.leases.settle(acked_later, Verdict::Ack));
    tokio::time::sleep(3 * LEASE).await;
    // Renewed at 20 s, 40 s, 60 s and 80 s, each before it would have lapsed, while the
    // first ack's call has not returned; the later ack with them, until its call.
    let renewals: Vec<Call> = calls(&script, Instant::now())
        .into_iter()
        .map(|(_, call)| call)
        .collect();
    assert_eq!(renewals, vec![Call::Renew(vec!["held", "acked later"]); 4]);
    assert_eq!(running.leases.len(), 3, "the first ack's call never ended");
}

/// A flush takes one batch: while that batch's call hangs, the settlements after it are
/// still renewed.
#[tokio::test(start_paused = true)]
async fn a_flush_takes_one_batch_so_the_settlements_after_it_stay_renewed() {
    let script = Script {
        settle_gate: Some(Arc::new(Semaphore::new(0))),
        ..Script::default()
    };
    let began = Instant::now();
    let running = start(&script);
    let tags: Vec<u64> = (0..15)
        .map(|i| {
            let name = if i < 10 { "in the batch" } else { "after it" };
            running.leases.insert(name, LEASE)
        })
        .collect();
    for tag in tags {
        assert!(running.leases.settle(tag, Verdict::Ack));
    }
    tokio::time::sleep(LEASE).await;
    // The first ten are in the call that hangs; the other five are renewed at 20 s.
    assert_eq!(
        calls(&script, began),
        [(Duration::from_secs(20), Call::Renew(vec!["after it"; 5]))]
    );
}

/// A settlement stays renewed while the work before its call is done (a dead letter's
/// send), however long that takes: settled with 26 s left and prepared for 30 s, its
/// message would otherwise show again (and run again) before its call.
#[tokio::test(start_paused = true)]
async fn a_settlement_stays_renewed_while_it_is_prepared() {
    let script = Script {
        prepare_latency: Duration::from_secs(30),
        ..Script::default()
    };
    let began = Instant::now();
    let running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    // Renewed at 20 s and 40 s, to lapse at 70 s; settled at 44 s.
    tokio::time::sleep(Duration::from_secs(44)).await;
    assert!(running.leases.settle(tag, rejected()));
    running.close().await;
    let calls: Vec<(u64, Call)> = calls(&script, began)
        .into_iter()
        .map(|(at, call)| (at.as_secs(), call))
        .collect();
    // Renewed at 60 s too, while it is prepared: it lapses at 90 s, after its call.
    assert_eq!(
        calls,
        [
            (20, Call::Renew(vec!["a"])),
            (40, Call::Renew(vec!["a"])),
            (60, Call::Renew(vec!["a"])),
            (74, Call::Settle(vec![("a", "reject")])),
            (74, Call::Finished),
        ]
    );
}

/// While a settlement call stalls, only its own batch is out of the pump's room: those
/// settled after it keep theirs, so what waits on a stalled broker is bounded.
#[tokio::test(start_paused = true)]
async fn a_stalled_settlement_call_frees_the_pumps_room_for_its_batch_only() {
    let gate = Arc::new(Semaphore::new(0));
    let script = Script {
        settle_gate: Some(gate.clone()),
        ..Script::default()
    };
    let running = start(&script);
    let tags: Vec<u64> = (0..3)
        .map(|_| running.leases.insert("first", LEASE))
        .collect();
    for tag in tags {
        assert!(running.leases.settle(tag, Verdict::Ack));
    }
    let mut started = script.settles_started.subscribe();
    started.wait_for(|started| *started == 1).await.unwrap();
    assert_eq!(
        (running.leases.len(), running.leases.holding()),
        (3, 0),
        "its batch is held until the call returns, out of the pump's way meanwhile"
    );
    let after: Vec<u64> = (0..2)
        .map(|_| running.leases.insert("after", LEASE))
        .collect();
    for tag in after {
        assert!(running.leases.settle(tag, Verdict::Ack));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        running.leases.holding(),
        2,
        "settlements behind the stalled call keep their room"
    );
    gate.add_permits(Semaphore::MAX_PERMITS);
    let leases = running.leases.clone();
    running.close().await;
    assert!(leases.is_empty());
    let calls: Vec<Call> = calls(&script, Instant::now())
        .into_iter()
        .map(|(_, call)| call)
        .collect();
    assert_eq!(
        calls,
        [
            Call::Settle(vec![("first", "ack"); 3]),
            Call::Settle(vec![("after", "ack"); 2]),
            Call::Finished,
        ],
        "one call each"
    );
}

/// A settlement call takes a batch (ten here), oldest first; the rest go in the next.
#[tokio::test(start_paused = true)]
async fn ten_settlements_share_one_call_and_more_go_in_the_next() {
    let script = Script::default();
    let running = start(&script);
    let tags: Vec<u64> = (0..12)
        .map(|i| {
            running
                .leases
                .insert(if i < 10 { "first" } else { "next" }, LEASE)
        })
        .collect();
    for tag in tags {
        assert!(running.leases.settle(tag, Verdict::Ack));
    }
    running.close().await;
    let calls: Vec<Call> = calls(&script, Instant::now())
        .into_iter()
        .map(|(_, call)| call)
        .collect();
    assert_eq!(
        calls,
        [
            Call::Settle(vec![("first", "ack"); 10]),
            Call::Settle(vec![("next", "ack"); 2]),
            Call::Finished,
        ]
    );
}

/// A settlement waits for others no longer than the linger from when it came, though a
/// renewal tick comes in between and renews its message meanwhile.
#[tokio::test(start_paused = true)]
async fn a_renewal_tick_does_not_restart_a_settlements_linger() {
    let script = Script::default();
    let began = Instant::now();
    let running = start_lingering(&script, Duration::from_secs(4));
    let tag = running.leases.insert("a", LEASE);
    tokio::time::sleep(Duration::from_secs(18)).await;
    assert!(running.leases.settle(tag, Verdict::Ack));
    // Due at 22 s; the tick at 20 s would have put it off to 24 s.
    tokio::time::sleep_until(began + Duration::from_millis(22_100)).await;
    assert_eq!(
        calls(&script, began),
        [
            (Duration::from_secs(20), Call::Renew(vec!["a"])),
            (Duration::from_secs(22), Call::Settle(vec![("a", "ack")])),
        ]
    );
    running.close().await;
}

/// A settlement's linger counts from when it came, though the keeper's settling loop
/// turns meanwhile: the pump starting, then stopping, to wait for room (which the one
/// settlement waiting would not make) does not start the linger again.
#[tokio::test(start_paused = true)]
async fn the_pump_waiting_for_room_a_while_does_not_restart_a_settlements_linger() {
    let script = Script::default();
    let began = Instant::now();
    let running = start_lingering(&script, Duration::from_secs(4));
    let tags = ["a", "b", "c", "d"].map(|name| running.leases.insert(name, LEASE));
    assert!(running.leases.settle(tags[0], Verdict::Ack));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Four held, the pump waits from 1 s to 2 s to hold fewer than two.
    let room = tokio::time::timeout(Duration::from_secs(1), running.leases.room_for(2)).await;
    assert!(room.is_err(), "one settlement makes no room");
    // Due at 4 s; the linger started again at 2 s would put it off to 6 s.
    tokio::time::sleep_until(began + Duration::from_millis(4_100)).await;
    assert_eq!(
        calls(&script, began),
        [(Duration::from_secs(4), Call::Settle(vec![("a", "ack")]))]
    );
    for tag in &tags[1..] {
        assert!(running.leases.settle(*tag, Verdict::Ack));
    }
    running.close().await;
}

/// A message held all along (a long handler, the hand-over, a lane retrying in place)
/// while 100 acks a second stream through, each call taking 20 ms: a settlement arrives
/// during every flush, and still the renewals keep their turn, so the held message's
/// lease never lapses.
#[tokio::test(start_paused = true)]
async fn renewals_keep_their_turn_under_a_steady_stream_of_acks() {
    let script = Script {
        latency: Duration::from_millis(20),
        ..Script::default()
    };
    let running = start(&script);
    let began = Instant::now();
    let held = running.leases.insert("held", LEASE);
    let mut acks = 0;
    while began.elapsed() < 2 * LEASE {
        let tag = running.leases.insert("acked", LEASE);
        assert!(running.leases.settle(tag, Verdict::Ack));
        acks += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let end = Instant::now();
    // Each renewal must reach the broker before the lease lapses, and renews it from then.
    let mut lapses = began + LEASE;
    for (at, call) in calls(&script, began) {
        if let Call::Renew(names) = call
            && names.contains(&"held")
        {
            let at = began + at;
            assert!(at < lapses, "renewed {:?} after it lapsed", at - lapses);
            lapses = at + LEASE;
        }
    }
    assert!(
        lapses > end,
        "the held message's lease lapsed {:?} into the run",
        lapses - began
    );
    assert!(running.leases.settle(held, Verdict::Ack));
    running.close().await;
    assert_eq!(settled_count(&script), acks + 1, "every ack made");
}

/// Once the subscription stops receiving, a settlement's call (a release of what the
/// pump read ahead, say) is made at once, not after the linger: that message shows to
/// other consumers again while the handlers still running finish.
#[tokio::test(start_paused = true)]
async fn draining_tells_the_transport_and_settles_at_once_not_after_the_linger() {
    let script = Script::default();
    let began = Instant::now();
    let running = start_lingering(&script, Duration::from_secs(5));
    let read_ahead = running.leases.insert("read ahead", LEASE);
    let running_one = running.leases.insert("running", LEASE);
    running.draining.send_replace(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        running
            .leases
            .settle(read_ahead, Verdict::Retry { after: None })
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        calls(&script, began),
        [
            (Duration::ZERO, Call::StoppedReceiving),
            (
                Duration::from_millis(100),
                Call::Settle(vec![("read ahead", "retry")])
            )
        ],
        "the transport told at once, to cut a waiting receive short"
    );
    assert!(running.leases.settle(running_one, Verdict::Ack));
    running.close().await;
}

/// Once the last settler is gone the keeper carries out what was settled and ends,
/// even if the subscription is never closed.
#[tokio::test(start_paused = true)]
async fn once_every_settler_is_gone_the_keeper_settles_the_rest_then_makes_its_last_call() {
    let script = Script::default();
    let mut running = start(&script);
    let tag = running.leases.insert("a", LEASE);
    assert!(running.leases.settle(tag, Verdict::Retry { after: None }));
    drop(running.alive.take());
    tokio::time::timeout(Duration::from_secs(60), running.keeper)
        .await
        .expect("the keeper ends")
        .unwrap();
    let calls: Vec<Call> = calls(&script, Instant::now())
        .into_iter()
        .map(|(_, call)| call)
        .collect();
    assert_eq!(
        calls,
        [Call::Settle(vec![("a", "retry")]), Call::Finished],
        "the last call after every settlement's"
    );
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
    assert!(running.leases.settle(tags[0], Verdict::Ack));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(calls(&script, began).is_empty(), "lingering for a batch");

    // Four held, the pump waits to hold fewer than three: two must go.
    let leases = running.leases.clone();
    let pump = tokio::spawn(async move { leases.room_for(3).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(calls(&script, began).is_empty(), "one sent makes no room");
    assert!(running.leases.settle(tags[1], Verdict::Ack));
    tokio::time::timeout(Duration::from_millis(1), pump)
        .await
        .expect("room once the two acks are sent")
        .unwrap();
    let both = Call::Settle(vec![("a", "ack"), ("b", "ack")]);
    assert_eq!(calls(&script, began), [(Duration::from_secs(2), both)]);

    // No pump waits any more: the next settlement lingers again.
    assert!(running.leases.settle(tags[2], Verdict::Ack));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(calls(&script, began).len(), 1, "lingering again");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        calls(&script, began).last(),
        Some(&(Duration::from_secs(12), Call::Settle(vec![("c", "ack")])))
    );
    assert!(running.leases.settle(tags[3], Verdict::Ack));
    running.close().await;
}

/// What a test logged, for assertions.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

thread_local! {
    /// Where this thread's log lines go while a test captures them.
    static CAPTURING: std::cell::RefCell<Option<Logs>> = const { std::cell::RefCell::new(None) };
}

impl Logs {
    /// Captures what this thread logs at INFO and up until the guard is dropped; a
    /// paused-clock test's runtime has one thread, so the keeper's task logs here.
    ///
    /// One global subscriber writes each thread's lines to that thread's capture. A
    /// scoped subscriber per test (`set_default`) lost an event now and then with tests
    /// running side by side: `tracing` caches whether a callsite is wanted for every
    /// thread at once.
    fn capture() -> (Logs, Capturing) {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(|| ThisThread)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in these tests");
        });
        let logs = Logs::default();
        CAPTURING.with(|capturing| *capturing.borrow_mut() = Some(logs.clone()));
        (logs, Capturing)
    }

    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Ends this thread's capture when dropped.
struct Capturing;

impl Drop for Capturing {
    fn drop(&mut self) {
        CAPTURING.with(|capturing| capturing.borrow_mut().take());
    }
}

/// Writes to this thread's capture, if any.
struct ThisThread;

impl std::io::Write for ThisThread {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        CAPTURING.with(|capturing| {
            if let Some(logs) = capturing.borrow().as_ref() {
                logs.0.lock().unwrap().extend_from_slice(bytes);
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
