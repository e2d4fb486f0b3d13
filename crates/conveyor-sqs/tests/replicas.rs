//! The replica test of `conveyor-lapin/tests/replicas.rs`, on an SQS FIFO queue: three
//! replica processes on one queue, one killed with SIGKILL, a fourth started later, 64
//! message groups, order checked per group.
//!
//! SQS FIFO needs no shards nor membership: it hands a group's next message to whichever
//! replica receives, and only once the group has nothing in flight. So a group is never
//! handled by two replicas at once and keeps its order across them, as a shard does
//! under `ReplicaGroup`; a killed replica's groups wait for its messages' visibility
//! timeout (here 3 s) instead of three heartbeats. There is no fixed spread to check:
//! groups go to whichever replica asks.
//!
//! The replicas are this test binary run again with `CONVEYOR_SQS_REPLICA` set (see
//! [`replica_process`]).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conveyor::{App, DeliveryInfo, Json, Message, Publisher, QueueSpec, State};
use conveyor_sqs::{SqsBroker, SqsQueueSpec};
use tokio::process::{Child, Command};

const KEYS: usize = 64;
/// One message per group every this often: moto scans the whole queue on every call, so
/// the queue is kept to a few hundred messages.
const ROUND_EVERY: Duration = Duration::from_millis(500);
const HANDLER_TIME: Duration = Duration::from_millis(10);
/// How long a received message stays invisible before the keeper renews it, and how
/// long a killed replica's messages stay invisible.
const VISIBILITY: Duration = Duration::from_secs(3);

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

async fn broker(endpoint: &str) -> SqsBroker {
    common::broker_at(endpoint, VISIBILITY).await
}

/// A moto server of the test's own, taking one receive at a time. moto's FIFO group hold
/// is not safe under concurrent receives: two replicas receiving at once can each get
/// messages of one group, out of order (seen in this test, 1 run in 5, and with a plain
/// boto3 script of four threads on `moto_server`: several groups out of order per 200
/// messages, none with the receives taken one at a time). Real SQS has no such race.
/// Other calls still run side by side, so a long poll holds up no publish.
struct Emulator {
    endpoint: String,
    _server: Child,
}

async fn serial_emulator() -> Emulator {
    const SERVE: &str = r#"
import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()
def serve(environ, start_response):
    if environ.get('HTTP_X_AMZ_TARGET', '').endswith('.ReceiveMessage'):
        with lock:
            return app(environ, start_response)
    return app(environ, start_response)
run_simple('127.0.0.1', int(sys.argv[1]), serve, threaded=True, use_reloader=False)
"#;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Command::new("python3")
        .args(["-c", SERVE, &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 with moto (scripts/services/sqs.sh installs it)");
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "moto did not start on {endpoint}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Emulator {
        endpoint,
        _server: server,
    }
}

// ---- the replica process ------------------------------------------------------------

#[derive(Clone)]
struct Log {
    replica: Arc<str>,
    file: Arc<Mutex<std::fs::File>>,
}

impl Log {
    /// One line per write, to a file opened for appending: lines of several processes
    /// never mix, and the file's order is the order they were written.
    fn line(&self, line: String) {
        self.file
            .lock()
            .unwrap()
            .write_all(line.as_bytes())
            .unwrap();
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
    let again = info.redelivered || info.receive_count.is_some_and(|n| n > 1);
    log.line(format!(
        "D {} {} {} {} {start} {}\n",
        log.replica,
        m.key,
        m.seq,
        u8::from(again),
        micros_now()
    ));
}

/// A replica, when this binary runs with
/// `CONVEYOR_SQS_REPLICA=<endpoint> <queue> <replica> <log>`:
/// serves the queue until SIGTERM, logging each delivery it handled. Does nothing in a
/// plain test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_process() {
    let Ok(config) = std::env::var("CONVEYOR_SQS_REPLICA") else {
        return;
    };
    let mut parts = config.split(' ');
    let (endpoint, queue, replica, path) = (
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
    );
    let broker = broker(&endpoint).await;
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
        .with_state(log)
        .mount(broker.queue(&queue), handle, |m| m.workers(8).by_key())
        .start()
        .await
        .unwrap();
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    term.recv().await;
    app.shutdown().await.unwrap();
}

// ---- reading the log ---------------------------------------------------------------

#[derive(Clone, Debug)]
struct Handled {
    replica: String,
    key: usize,
    seq: u64,
    again: bool,
    start: u64,
    end: u64,
}

fn read_log(path: &Path) -> Vec<Handled> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|line| line.ends_with('\n'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.trim_end().split(' ').collect();
            (fields.first() == Some(&"D")).then(|| Handled {
                replica: fields[1].to_string(),
                key: fields[2].parse().unwrap(),
                seq: fields[3].parse().unwrap(),
                again: fields[4] == "1",
                start: fields[5].parse().unwrap(),
                end: fields[6].parse().unwrap(),
            })
        })
        .collect()
}

async fn wait_log(
    path: &Path,
    what: &str,
    within: Duration,
    mut done: impl FnMut(&[Handled]) -> bool,
) -> Vec<Handled> {
    let deadline = Instant::now() + within;
    loop {
        let seen = read_log(path);
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- the test -------------------------------------------------------------------

fn spawn_replica(endpoint: &str, queue: &str, name: &str, log: &Path, dir: &Path) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "replica_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "CONVEYOR_SQS_REPLICA",
            format!("{endpoint} {queue} {name} {}", log.display()),
        )
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn terminate(child: &mut Child) {
    let pid = child.id().unwrap();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    let status = exited
        .expect("a replica exits within 30 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "a replica exited with {status}");
}

async fn publish_rounds(
    broker: SqsBroker,
    queue: String,
    rounds: Arc<std::sync::atomic::AtomicU64>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(ROUND_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    while !*stop.borrow() {
        tick.tick().await;
        let messages = (0..KEYS)
            .map(|key| {
                Message::builder()
                    .partition_key(format!("key-{key}"))
                    .json(&Numbered { key, seq })
                    .unwrap()
            })
            .collect();
        broker.publish_batch(&queue, messages).await.unwrap();
        seq += 1;
        rounds.store(seq, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Each group in order across the replicas; a message handled twice only when `killed`
/// handled it first (killed before deleting it) and it came back received again.
fn assert_each_group_in_order(seen: &[Handled], killed: &str) -> usize {
    let mut next: BTreeMap<usize, u64> = BTreeMap::new();
    let mut by: BTreeMap<(usize, u64), &str> = BTreeMap::new();
    let mut again = 0;
    for h in seen {
        let expected = next.entry(h.key).or_insert(0);
        if h.seq == *expected {
            *expected += 1;
        } else if h.seq < *expected {
            let first = by.get(&(h.key, h.seq)).copied().unwrap_or("nobody");
            assert!(
                h.again && first == killed,
                "group {} seq {} handled again by {} after {first}: {h:?}",
                h.key,
                h.seq,
                h.replica
            );
            again += 1;
        } else {
            panic!(
                "group {} handled {} by {} before {} (out of order)",
                h.key, h.seq, h.replica, expected
            );
        }
        by.entry((h.key, h.seq)).or_insert(h.replica.as_str());
    }
    again
}

/// No two replicas handled one group at the same time.
fn assert_one_replica_per_group_at_a_time(seen: &[Handled]) {
    let mut by_key: BTreeMap<usize, Vec<&Handled>> = BTreeMap::new();
    for h in seen {
        by_key.entry(h.key).or_default().push(h);
    }
    for (key, mut handled) in by_key {
        handled.sort_by_key(|h| h.start);
        for pair in handled.windows(2) {
            assert!(
                pair[0].end <= pair[1].start,
                "group {key}: {:?} and {:?} overlap",
                pair[0],
                pair[1]
            );
        }
    }
}

fn first_after(seen: &[Handled], replica: &str, after: u64) -> Option<u64> {
    seen.iter()
        .filter(|h| h.replica == replica && h.start >= after)
        .map(|h| h.start)
        .min()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_groups_keep_their_order_across_replicas_through_a_kill_and_a_join() {
    let test_start = Instant::now();
    let emulator = serial_emulator().await;
    let endpoint = emulator.endpoint.as_str();
    let broker = broker(endpoint).await;
    let queue = common::declare(
        &broker,
        QueueSpec::new(common::unique("replicas", true)).content_based_deduplication(),
    )
    .await;
    let dir = std::env::temp_dir().join(format!("conveyor-{queue}.d"));
    std::fs::create_dir_all(&dir).unwrap();
    let log: PathBuf = dir.join("handled.log");

    let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop_publishing, stop) = tokio::sync::watch::channel(false);
    let publishing = tokio::spawn(publish_rounds(
        broker.clone(),
        queue.clone(),
        rounds.clone(),
        stop,
    ));

    let mut a = spawn_replica(endpoint, &queue, "a", &log, &dir);
    let mut b = spawn_replica(endpoint, &queue, "b", &log, &dir);
    let mut c = spawn_replica(endpoint, &queue, "c", &log, &dir);
    wait_log(
        &log,
        "a, b and c each handling",
        Duration::from_secs(60),
        |seen| {
            ["a", "b", "c"]
                .iter()
                .all(|r| seen.iter().filter(|h| h.replica == *r).count() >= 40)
        },
    )
    .await;

    // c dies: the groups it held wait for the visibility timeout, then go on elsewhere.
    c.start_kill().unwrap();
    let killed = micros_now();
    c.wait().await.unwrap();
    let in_flight_at_kill = |seen: &[Handled]| -> BTreeSet<usize> {
        // The groups whose last message handled before the kill was c's.
        let mut last: BTreeMap<usize, &str> = BTreeMap::new();
        for h in seen.iter().filter(|h| h.end <= killed) {
            last.insert(h.key, h.replica.as_str());
        }
        last.into_iter()
            .filter(|(_, r)| *r == "c")
            .map(|(k, _)| k)
            .collect()
    };
    let seen = wait_log(
        &log,
        "every group handled by a or b after the kill",
        Duration::from_secs(30),
        |seen| {
            (0..KEYS).all(|key| {
                seen.iter()
                    .any(|h| h.key == key && h.start >= killed && h.replica != "c")
            })
        },
    )
    .await;
    let c_groups = in_flight_at_kill(&seen);
    let after_kill = Duration::from_micros(
        (0..KEYS)
            .filter_map(|key| {
                seen.iter()
                    .filter(|h| h.key == key && h.start >= killed && h.replica != "c")
                    .map(|h| h.start)
                    .min()
            })
            .max()
            .unwrap()
            - killed,
    );

    // d joins and gets groups at once.
    let joining = micros_now();
    let mut d = spawn_replica(endpoint, &queue, "d", &log, &dir);
    let seen = wait_log(&log, "d handling", Duration::from_secs(30), |seen| {
        seen.iter()
            .filter(|h| h.replica == "d" && h.start >= joining)
            .count()
            >= 40
    })
    .await;
    let after_join = Duration::from_micros(first_after(&seen, "d", joining).unwrap() - joining);

    stop_publishing.send(true).unwrap();
    publishing.await.unwrap();
    let published = rounds.load(std::sync::atomic::Ordering::SeqCst);
    let seen = wait_log(
        &log,
        "every message handled",
        Duration::from_secs(60),
        |seen| {
            let mut handled: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
            for h in seen {
                handled.entry(h.key).or_default().insert(h.seq);
            }
            handled.len() == KEYS && handled.values().all(|seqs| seqs.len() as u64 == published)
        },
    )
    .await;
    for replica in [&mut a, &mut b, &mut d] {
        terminate(replica).await;
    }

    let again = assert_each_group_in_order(&seen, "c");
    assert_one_replica_per_group_at_a_time(&seen);
    let per_replica: BTreeMap<&str, usize> = seen.iter().fold(BTreeMap::new(), |mut n, h| {
        *n.entry(h.replica.as_str()).or_default() += 1;
        n
    });
    println!(
        "{} messages over {KEYS} groups; per replica {per_replica:?}; {} groups last handled \
         by c before the kill; handled again after the kill: {again}; every group handled \
         again {after_kill:?} after the kill; d handled its first message {after_join:?} \
         after it started; whole test {:?}",
        published * KEYS as u64,
        c_groups.len(),
        test_start.elapsed()
    );
    // The visibility timeout, the keeper's last renewal before the kill, and a receive.
    let bound = VISIBILITY * 2 + Duration::from_secs(3);
    assert!(
        after_kill <= bound,
        "the groups went on {after_kill:?} after the kill, over {bound:?}"
    );

    common::delete(&broker, &[&queue]).await;
    let _ = std::fs::remove_dir_all(&dir);
}
