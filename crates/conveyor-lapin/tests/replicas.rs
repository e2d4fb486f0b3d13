//! Ordered shards over replica processes: 12 shard queues behind a consistent-hash
//! exchange, consumed by replicas that agree through the broker alone. Three replica
//! processes start; one is killed with SIGKILL; a fourth joins later. Every replica
//! appends what it handled to one log file; the test checks each key's order across the
//! replicas, that nothing is lost, the spread (4/4/4, then 6/6, then 4/4/4), and how long
//! the shards took to move.
//!
//! The replicas are this test binary run again with `CONVEYOR_REPLICA` set (see
//! [`replica_process`]).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conveyor::{App, DeliveryInfo, Json, Message, State};
use conveyor_lapin::{ConsistentHash, LapinBroker, PublishOptions, RabbitQueueSpec, ReplicaGroup};
use tokio::process::{Child, Command};

const SHARDS: usize = 12;
const KEYS: usize = 64;
const HEARTBEAT: Duration = Duration::from_secs(1);
/// One message per key every this often.
const ROUND_EVERY: Duration = Duration::from_millis(100);
/// How long each handler runs, so that a replica killed has work in flight.
const HANDLER_TIME: Duration = Duration::from_millis(10);

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

// ---- the replica process ------------------------------------------------------------

#[derive(Clone)]
struct Log {
    replica: Arc<str>,
    file: Arc<Mutex<std::fs::File>>,
}

impl Log {
    /// One line per write: the file is opened for appending, so lines of several
    /// processes never mix, and their order in the file is the order they were written.
    fn line(&self, line: String) {
        let mut file = self.file.lock().unwrap();
        file.write_all(line.as_bytes()).unwrap();
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Numbered {
    key: usize,
    seq: u64,
}

async fn handle(Json(m): Json<Numbered>, info: DeliveryInfo, State(log): State<Log>) {
    let start = micros_now();
    tokio::time::sleep(HANDLER_TIME).await;
    let shard = info.queue.rsplit('.').next().unwrap_or("?").to_string();
    log.line(format!(
        "D {} {shard} {} {} {} {start} {}\n",
        log.replica,
        m.key,
        m.seq,
        u8::from(info.redelivered),
        micros_now()
    ));
}

/// A replica, when this binary runs with `CONVEYOR_REPLICA=<group> <replica> <log>`: it
/// serves the group until SIGTERM, logging each delivery it handled (`D` lines) and each
/// change of the shards its health shows (`H` lines). Does nothing in a plain test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_process() {
    let Ok(config) = std::env::var("CONVEYOR_REPLICA") else {
        return;
    };
    let mut parts = config.split(' ');
    let (group, replica, path) = (
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
    );
    let broker = common::broker_named(&replica).await;
    let queues = shard_topology(&group).declare(&broker).await.unwrap();
    let members = ReplicaGroup::new(&group, SHARDS)
        .heartbeat(HEARTBEAT)
        .id(&replica)
        .join(&broker)
        .await
        .unwrap();
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .unwrap();
    let log = Log {
        replica: replica.as_str().into(),
        file: Arc::new(Mutex::new(file)),
    };
    let app = App::new(&replica)
        .broker(broker.clone())
        .with_state(log.clone())
        .mount(members.shards(queues), handle, |m| m.workers(2).by_key())
        .start()
        .await
        .unwrap();
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let mut last: Option<Vec<usize>> = None;
    loop {
        let held = app.health().mounts[0].shards.clone().unwrap_or_default();
        if last.as_ref() != Some(&held) {
            let shown: Vec<String> = held.iter().map(ToString::to_string).collect();
            log.line(format!(
                "H {replica} {} {}\n",
                micros_now(),
                shown.join(",")
            ));
            last = Some(held);
        }
        tokio::select! {
            _ = term.recv() => break,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    let (left, shut) = tokio::join!(members.leave(), app.shutdown());
    let () = left;
    shut.unwrap();
}

fn shard_topology(group: &str) -> ConsistentHash {
    ConsistentHash::new(group, SHARDS).queue(|spec| spec.single_active_consumer())
}

// ---- reading the log ---------------------------------------------------------------

#[derive(Clone, Debug)]
struct Handled {
    replica: String,
    shard: usize,
    key: usize,
    seq: u64,
    redelivered: bool,
    start: u64,
    end: u64,
}

#[derive(Default, Debug)]
struct Seen {
    handled: Vec<Handled>,
    /// Each replica's shards, as its last `H` line says.
    held: BTreeMap<String, Vec<usize>>,
}

fn read_log(path: &Path) -> Seen {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = Seen::default();
    // Only whole lines: a writer may be half-way through the last one.
    for line in text
        .split_inclusive('\n')
        .filter(|line| line.ends_with('\n'))
    {
        let fields: Vec<&str> = line.trim_end().split(' ').collect();
        match fields.first() {
            Some(&"D") => seen.handled.push(Handled {
                replica: fields[1].to_string(),
                shard: fields[2].parse().unwrap(),
                key: fields[3].parse().unwrap(),
                seq: fields[4].parse().unwrap(),
                redelivered: fields[5] == "1",
                start: fields[6].parse().unwrap(),
                end: fields[7].parse().unwrap(),
            }),
            Some(&"H") => {
                let shards = fields
                    .get(3)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.split(',').map(|n| n.parse().unwrap()).collect())
                    .unwrap_or_default();
                seen.held.insert(fields[1].to_string(), shards);
            }
            _ => {}
        }
    }
    seen
}

impl Seen {
    /// Whether exactly `replicas` hold shards, each its fair share, all shards once.
    fn spread_over(&self, replicas: &[&str]) -> bool {
        let holding: BTreeSet<&str> = self
            .held
            .iter()
            .filter(|(_, shards)| !shards.is_empty())
            .map(|(replica, _)| replica.as_str())
            .collect();
        let share = SHARDS / replicas.len();
        let all: BTreeSet<usize> = self.held.values().flatten().copied().collect();
        let total: usize = self.held.values().map(Vec::len).sum();
        holding == replicas.iter().copied().collect()
            && replicas
                .iter()
                .all(|r| self.held.get(*r).is_some_and(|s| s.len() == share))
            && all.len() == SHARDS
            && total == SHARDS
    }

    /// When `replica` first handled a delivery of `shard` after `after` (µs).
    fn first_after(&self, replica: &str, shard: usize, after: u64) -> Option<u64> {
        self.handled
            .iter()
            .filter(|h| h.replica == replica && h.shard == shard && h.start >= after)
            .map(|h| h.start)
            .min()
    }
}

// ---- the test -------------------------------------------------------------------

struct Replica {
    name: String,
    child: Child,
}

fn spawn_replica(group: &str, name: &str, log: &Path, dir: &Path) -> Replica {
    let exe = std::env::current_exe().unwrap();
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let child = Command::new(exe)
        .args([
            "--exact",
            "replica_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "CONVEYOR_REPLICA",
            format!("{group} {name} {}", log.display()),
        )
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Replica {
        name: name.to_string(),
        child,
    }
}

async fn terminate(replica: &mut Replica) {
    let pid = replica.child.id().unwrap();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = tokio::time::timeout(Duration::from_secs(30), replica.child.wait()).await;
    let status = exited
        .expect("a replica exits within 30 s of SIGTERM")
        .unwrap();
    assert!(
        status.success(),
        "replica {} exited with {status}",
        replica.name
    );
}

/// Waits until the log shows `what`, for at most `within`; returns the log then.
async fn wait_log(
    path: &Path,
    what: &str,
    within: Duration,
    mut done: impl FnMut(&Seen) -> bool,
) -> Seen {
    let deadline = Instant::now() + within;
    loop {
        let seen = read_log(path);
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}; held: {:?}",
            seen.held
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn publish_rounds(
    broker: LapinBroker,
    exchange: String,
    rounds: Arc<std::sync::atomic::AtomicU64>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let publisher = broker.publisher().await.unwrap();
    let mut tick = tokio::time::interval(ROUND_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    while !*stop.borrow() {
        tick.tick().await;
        let sends = (0..KEYS).map(|key| {
            let message = Message::builder()
                .partition_key(format!("key-{key}"))
                .json(&Numbered { key, seq })
                .unwrap();
            publisher.publish_to(&exchange, "", message, PublishOptions::default())
        });
        for sent in futures_util::future::join_all(sends).await {
            sent.unwrap();
        }
        seq += 1;
        rounds.store(seq, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Every key's deliveries in the order the replicas handled them (the log's order): each
/// is the next of its key, or one that `killed` handled and was killed before acking,
/// handled again as a redelivery. Returns how many were handled again.
fn assert_each_key_in_order(seen: &Seen, killed: &str) -> usize {
    let mut next: BTreeMap<usize, u64> = BTreeMap::new();
    let mut by: BTreeMap<(usize, u64), &str> = BTreeMap::new();
    let mut again = 0;
    for h in &seen.handled {
        let expected = next.entry(h.key).or_insert(0);
        if h.seq == *expected {
            *expected += 1;
        } else if h.seq < *expected {
            let first = by.get(&(h.key, h.seq)).copied().unwrap_or("nobody");
            assert!(
                h.redelivered && first == killed,
                "key {} seq {} handled again by {} after {first}: only what the killed replica \
                 had not acked may come again: {h:?}",
                h.key,
                h.seq,
                h.replica
            );
            again += 1;
        } else {
            panic!(
                "key {} handled {} by {} before {} (out of order)",
                h.key, h.seq, h.replica, expected
            );
        }
        by.entry((h.key, h.seq)).or_insert(h.replica.as_str());
    }
    again
}

/// No two replicas handled deliveries of one shard at the same time.
fn assert_one_replica_per_shard_at_a_time(seen: &Seen) {
    let mut by_shard: BTreeMap<usize, Vec<&Handled>> = BTreeMap::new();
    for h in &seen.handled {
        by_shard.entry(h.shard).or_default().push(h);
    }
    for (shard, mut handled) in by_shard {
        handled.sort_by_key(|h| h.start);
        let mut last_end: BTreeMap<&str, u64> = BTreeMap::new();
        for h in handled {
            for (other, end) in &last_end {
                assert!(
                    *other == h.replica || *end <= h.start,
                    "shard {shard}: {} started {} µs before {other} finished",
                    h.replica,
                    end - h.start
                );
            }
            let end = last_end.entry(h.replica.as_str()).or_insert(0);
            *end = (*end).max(h.end);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_shards_evenly_and_keep_each_key_in_order_across_a_kill_and_a_join() {
    let test_start = Instant::now();
    let broker = common::broker().await;
    let group = common::unique("replicas");
    let dir = std::env::temp_dir().join(format!("{group}.d"));
    std::fs::create_dir_all(&dir).unwrap();
    let log: PathBuf = dir.join("handled.log");
    let topology = shard_topology(&group);
    let queue_names = topology.queue_names();
    topology.declare(&broker).await.unwrap();

    let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop_publishing, stop) = tokio::sync::watch::channel(false);
    let publishing = tokio::spawn(publish_rounds(
        broker.clone(),
        group.clone(),
        rounds.clone(),
        stop,
    ));

    // Three replicas: 4 shards each.
    let mut a = spawn_replica(&group, "a", &log, &dir);
    let mut b = spawn_replica(&group, "b", &log, &dir);
    let mut c = spawn_replica(&group, "c", &log, &dir);
    let seen = wait_log(
        &log,
        "4/4/4 over a, b, c",
        Duration::from_secs(60),
        |seen| seen.spread_over(&["a", "b", "c"]),
    )
    .await;
    let c_shards = seen.held["c"].clone();
    // Some work done by each before the kill.
    let before = seen.handled.len();
    wait_log(
        &log,
        "each replica handling",
        Duration::from_secs(30),
        |seen| {
            ["a", "b", "c"]
                .iter()
                .all(|r| seen.handled[before..].iter().any(|h| h.replica == *r))
        },
    )
    .await;

    // c dies: its 4 shards go to a and b, 6 each.
    c.child.start_kill().unwrap();
    let killed = micros_now();
    c.child.wait().await.unwrap();
    let seen = wait_log(
        &log,
        "6/6 over a and b with c's shards handled again",
        Duration::from_secs(30),
        |seen| {
            let mut seen_held = seen.held.clone();
            seen_held.remove("c");
            let spread = Seen {
                handled: Vec::new(),
                held: seen_held,
            }
            .spread_over(&["a", "b"]);
            spread
                && c_shards.iter().all(|&shard| {
                    seen.first_after("a", shard, killed).is_some()
                        || seen.first_after("b", shard, killed).is_some()
                })
        },
    )
    .await;
    let after_kill = c_shards
        .iter()
        .filter_map(|&shard| {
            [
                seen.first_after("a", shard, killed),
                seen.first_after("b", shard, killed),
            ]
            .into_iter()
            .flatten()
            .min()
        })
        .max()
        .unwrap()
        - killed;
    let after_kill = Duration::from_micros(after_kill);

    // d joins: 4 each again.
    let joining = micros_now();
    let mut d = spawn_replica(&group, "d", &log, &dir);
    let seen = wait_log(
        &log,
        "4/4/4 over a, b, d with d handling its shards",
        Duration::from_secs(30),
        |seen| {
            let mut held = seen.held.clone();
            held.remove("c");
            let spread = Seen {
                handled: Vec::new(),
                held,
            }
            .spread_over(&["a", "b", "d"]);
            spread
                && seen.held["d"]
                    .iter()
                    .all(|&shard| seen.first_after("d", shard, joining).is_some())
        },
    )
    .await;
    let d_shards = seen.held["d"].clone();
    let after_join = Duration::from_micros(
        d_shards
            .iter()
            .filter_map(|&shard| seen.first_after("d", shard, joining))
            .max()
            .unwrap()
            - joining,
    );

    // a leaves cleanly (SIGTERM): b and d take its shards at once, idle until a has
    // drained and closed them.
    let leaving = micros_now();
    let a_shards = seen.held["a"].clone();
    terminate(&mut a).await;
    let seen = wait_log(
        &log,
        "6/6 over b and d with a's shards handled again",
        Duration::from_secs(30),
        |seen| {
            let mut held = seen.held.clone();
            held.remove("c");
            held.remove("a");
            let spread = Seen {
                handled: Vec::new(),
                held,
            }
            .spread_over(&["b", "d"]);
            spread
                && a_shards.iter().all(|&shard| {
                    seen.first_after("b", shard, leaving).is_some()
                        || seen.first_after("d", shard, leaving).is_some()
                })
        },
    )
    .await;
    let after_leave = Duration::from_micros(
        a_shards
            .iter()
            .filter_map(|&shard| {
                [
                    seen.first_after("b", shard, leaving),
                    seen.first_after("d", shard, leaving),
                ]
                .into_iter()
                .flatten()
                .min()
            })
            .max()
            .unwrap()
            - leaving,
    );

    // Stop publishing; everything published is handled.
    stop_publishing.send(true).unwrap();
    publishing.await.unwrap();
    let published = rounds.load(std::sync::atomic::Ordering::SeqCst);
    let seen = wait_log(
        &log,
        "every message handled",
        Duration::from_secs(60),
        |seen| {
            let mut handled: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
            for h in &seen.handled {
                handled.entry(h.key).or_default().insert(h.seq);
            }
            handled.len() == KEYS && handled.values().all(|seqs| seqs.len() as u64 == published)
        },
    )
    .await;
    for replica in [&mut b, &mut d] {
        terminate(replica).await;
    }

    let again = assert_each_key_in_order(&seen, "c");
    assert_one_replica_per_shard_at_a_time(&seen);
    let bound = HEARTBEAT * 4 + Duration::from_secs(2);
    println!(
        "{} messages over {KEYS} keys; handled again after the kill: {again}; c's shards handled again \
         {after_kill:?} after the kill; d handled its shards {after_join:?} after it started; \
         a's shards handled again {after_leave:?} after its SIGTERM; whole test {:?}",
        published * KEYS as u64,
        test_start.elapsed()
    );
    assert!(
        after_kill <= bound,
        "the shards moved in {after_kill:?}, over {bound:?}"
    );
    // A joining replica waits a heartbeat and a half before it plans; the others hear
    // it within a heartbeat; then process start-up and the drain of the shards it takes.
    let join_bound = HEARTBEAT * 3 + Duration::from_secs(3);
    assert!(
        after_join <= join_bound,
        "the shards moved to d in {after_join:?}, over {join_bound:?}"
    );

    let names: Vec<&str> = queue_names.iter().map(String::as_str).collect();
    common::cleanup(&broker, &names, &[&group, &format!("{group}.replicas")]).await;
    let _ = std::fs::remove_dir_all(&dir);
}
