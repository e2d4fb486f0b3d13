//! The `conveyor` binary, run as a subprocess against the live RabbitMQ, the SQS emulator,
//! NATS with JetStream and Redis (`scripts/services/`): each command on each broker, the
//! dead-letter redrive with its filter, limit and dry run, and a redrive interrupted
//! mid-way and run again.

use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use conveyor::{App, Broker, DeadLetter, Message, Outcome, Publisher, QueueSpec};
use conveyor_lapin::LapinBroker;
use conveyor_nats::NatsBroker;
use conveyor_redis::RedisBroker;
use conveyor_sqs::SqsBroker;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const SQS_URL: &str = "sqs://us-east-1/127.0.0.1:4566";
const NATS_URL: &str = "nats://127.0.0.1:4222";
const REDIS_URL: &str = "redis://127.0.0.1:6379/0";
/// How long a command or a condition may take before the test gives up on it: a guard
/// against a hang, never a measure. Generous: a redrive of 400 messages through the SQS
/// emulator takes half a minute on an idle 2-core machine, and over a minute under a
/// parallel test run's load (it failed at 60 s so).
const DEADLINE: Duration = Duration::from_secs(300);

/// A broker under test, and how the binary reaches it.
struct Live<B> {
    broker: B,
    url: &'static str,
    /// Whether queues are FIFO: on SQS, where only FIFO queues carry a partition key.
    fifo: bool,
    /// Whether the broker counts a message handed back as in flight, not ready, until it
    /// is acknowledged (JetStream): the tests then count what a queue holds, ready and in
    /// flight, as `conveyor peek` and `redrive` do there.
    handed_back_in_flight: bool,
}

async fn rabbitmq() -> Live<LapinBroker> {
    let broker = LapinBroker::connect(AMQP_URL)
        .await
        .expect("RabbitMQ on 127.0.0.1:5672 (scripts/services/rabbitmq.sh)");
    Live {
        broker,
        url: AMQP_URL,
        fifo: false,
        handed_back_in_flight: false,
    }
}

async fn sqs() -> Live<SqsBroker> {
    let broker = SqsBroker::builder()
        .endpoint("http://127.0.0.1:4566")
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .build()
        .await
        .expect("the SQS emulator on 127.0.0.1:4566 (scripts/services/sqs.sh)");
    Live {
        broker,
        url: SQS_URL,
        fifo: true,
        handed_back_in_flight: false,
    }
}

async fn nats() -> Live<NatsBroker> {
    let broker = NatsBroker::connect(NATS_URL)
        .await
        .expect("NATS with JetStream on 127.0.0.1:4222 (scripts/services/nats.sh)");
    Live {
        broker,
        url: NATS_URL,
        fifo: false,
        handed_back_in_flight: true,
    }
}

async fn redis() -> Live<RedisBroker> {
    let broker = RedisBroker::connect(REDIS_URL)
        .await
        .expect("Redis on 127.0.0.1:6379 (scripts/services/redis.sh)");
    Live {
        broker,
        url: REDIS_URL,
        fifo: false,
        handed_back_in_flight: false,
    }
}

fn unique(stem: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("cli-{stem}-{}-{nanos:x}-{n}", std::process::id())
}

/// What a run of the binary printed, and how it ended.
#[derive(Debug)]
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl<B: Broker> Live<B> {
    /// The binary, on this broker; SQS credentials from the environment, as the
    /// standard chain reads them.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_conveyor"));
        command
            .arg("--broker")
            .arg(self.url)
            .args(args)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    async fn run(&self, args: &[&str]) -> Ran {
        self.run_with_input(args, None).await
    }

    /// `conveyor redrive FROM --to TO` with `options`.
    async fn redrive(&self, from: &str, to: &str, options: &[&str]) -> Ran {
        let mut args = vec!["redrive", from, "--to", to];
        args.extend_from_slice(options);
        self.run(&args).await
    }

    async fn run_with_input(&self, args: &[&str], input: Option<&[u8]>) -> Ran {
        let mut command = self.command(args);
        if input.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("the conveyor binary starts");
        if let Some(input) = input {
            let mut stdin = child.stdin.take().expect("a piped stdin");
            stdin.write_all(input).await.expect("stdin takes the input");
            drop(stdin);
        }
        let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
            .await
            .expect("the command ends within the deadline")
            .expect("the command's output");
        Ran {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn name(&self, stem: &str) -> String {
        let name = unique(stem);
        if self.fifo {
            format!("{name}.fifo")
        } else {
            name
        }
    }

    async fn declare(&self, stem: &str) -> String {
        let name = self.name(stem);
        self.broker
            .declare_queue(&QueueSpec::new(name.as_str()))
            .await
            .expect("the queue is declared");
        name
    }

    /// A queue whose rejected messages go to a dead-letter queue: (queue, dlq).
    async fn declare_with_dead_letters(&self, stem: &str) -> (String, String) {
        let dead = self.declare(&format!("{stem}-dead")).await;
        let name = self.name(stem);
        let spec = QueueSpec::new(name.as_str()).dead_letter_queue(dead.as_str(), 10);
        self.broker
            .declare_queue(&spec)
            .await
            .expect("the queue is declared");
        (name, dead)
    }

    async fn ready(&self, queue: &str) -> u64 {
        let depth = self
            .broker
            .queue_depth(queue)
            .await
            .expect("the queue's depth");
        if self.handed_back_in_flight {
            depth.ready + depth.in_flight.unwrap_or(0)
        } else {
            depth.ready
        }
    }

    async fn wait_ready(&self, queue: &str, count: u64) {
        self.wait_ready_within(queue, count, DEADLINE).await;
    }

    async fn wait_ready_within(&self, queue: &str, count: u64, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let ready = self.ready(queue).await;
            if ready == count {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "`{queue}` holds {ready} ready, not {count}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes every message of `queue` out (waiting until `count` are there).
    async fn take(&self, queue: &str, count: usize) -> Vec<DeadLetter> {
        let mut taken = Vec::new();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while taken.len() < count {
            let more = self
                .broker
                .take_dead_letters(queue, count - taken.len())
                .await
                .expect("messages taken");
            if more.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            taken.extend(more);
            assert!(
                tokio::time::Instant::now() < deadline,
                "`{queue}` gave {} of {count}",
                taken.len()
            );
        }
        taken
    }

    async fn delete(&self, queues: &[&str]) {
        for queue in queues {
            let _ = self.broker.delete_queue(queue).await;
        }
    }
}

fn json(id: u32, tenant: &str) -> Message {
    Message::builder()
        .partition_key(format!("k{id}"))
        .header("x-tenant", tenant.to_string())
        .message_id(format!("m-{id}"))
        .json(&serde_json::json!({ "id": id, "tenant": tenant }))
        .expect("JSON encodes")
}

fn id_of(letter: &DeadLetter) -> u64 {
    let body: serde_json::Value = serde_json::from_slice(&letter.payload).expect("a JSON body");
    body["id"].as_u64().expect("an id")
}

async fn refuse(_: conveyor::Bytes) -> Outcome {
    Outcome::Reject
}

/// Dead-letters `messages` the way a service does: published to `queue`, rejected by a
/// handler, so each arrives in the dead-letter queue with the transport's headers and
/// Conveyor's reason.
async fn dead_letter<B: Broker>(live: &Live<B>, queue: &str, dead: &str, messages: Vec<Message>) {
    let count = u64::try_from(messages.len()).expect("a count");
    live.broker
        .publish_batch(queue, messages)
        .await
        .expect("published");
    let app = App::new("refuser")
        .mount(live.broker.queue(queue), refuse, |m| m)
        .start()
        .await
        .expect("the refuser starts");
    live.wait_ready(dead, count).await;
    app.shutdown().await.expect("the refuser stops");
}

async fn depth_prints_each_queues_counts<B: Broker>(live: Live<B>) {
    let (a, b) = (live.declare("depth-a").await, live.declare("depth-b").await);
    let messages = (0..3).map(|id| json(id, "acme")).collect();
    live.broker
        .publish_batch(&a, messages)
        .await
        .expect("published");
    live.wait_ready(&a, 3).await;
    let ran = live.run(&["depth", &a, &b]).await;
    assert!(ran.status.success(), "{ran:?}");
    let rows: Vec<Vec<&str>> = ran
        .stdout
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["QUEUE", "READY", "IN", "FLIGHT", "DELAYED"]);
    assert_eq!(rows[1][..2], [a.as_str(), "3"]);
    assert_eq!(rows[2][..2], [b.as_str(), "0"]);
    assert_eq!(rows.len(), 3);
    live.delete(&[&a, &b]).await;
}

async fn depth_watch_redraws_the_table_in_place_until_interrupted<B: Broker>(live: Live<B>) {
    use tokio::io::AsyncReadExt;

    let queue = live.declare("watch").await;
    let mut child = live
        .command(&["depth", &queue, "--watch", "0.1"])
        .spawn()
        .expect("the watch starts");
    let mut stdout = child.stdout.take().expect("a piped stdout");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    // The second table comes after the cursor is moved back up over the first (two
    // lines: the heading and the queue) and the screen cleared from there.
    let redraw = b"\x1b[2F\x1b[J";
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !seen.windows(redraw.len()).any(|w| w == redraw) {
        let read = tokio::time::timeout_at(deadline, stdout.read(&mut chunk))
            .await
            .expect("the table is redrawn within the deadline")
            .expect("stdout reads");
        assert!(
            read > 0,
            "the watch ended: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&chunk[..read]);
    }
    let pid = child.id().expect("a running watch").to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status();
    assert!(signalled.expect("kill runs").success());
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("the watch ends when interrupted")
        .expect("its status");
    assert!(status.success(), "{status:?}");
    live.delete(&[&queue]).await;
}

async fn peek_shows_messages_and_leaves_them_in_the_queue<B: Broker>(live: Live<B>) {
    let (queue, dead) = live.declare_with_dead_letters("peek").await;
    dead_letter(
        &live,
        &queue,
        &dead,
        vec![json(1, "acme"), json(2, "globex")],
    )
    .await;
    let ran = live.run(&["peek", &dead, "-n", "5"]).await;
    assert!(ran.status.success(), "{ran:?}");
    let out = &ran.stdout;
    assert!(
        out.contains("--- message 1\n") && out.contains("--- message 2\n"),
        "{out}"
    );
    assert!(out.contains("partition key: k1"), "{out}");
    assert!(out.contains("dead-letter reason: "), "{out}");
    assert!(out.contains("  x-tenant: globex"), "{out}");
    assert!(out.contains("attempt: "), "{out}");
    // Pretty-printed JSON.
    assert!(
        out.contains("{\n  \"id\": 1,\n  \"tenant\": \"acme\"\n}"),
        "{out}"
    );
    assert!(out.contains("2 shown of 2 ready"), "{out}");
    // Nothing was consumed for good.
    live.wait_ready(&dead, 2).await;
    // Asked for none, it says so: not that none is ready.
    let ran = live.run(&["peek", &dead, "-n", "0"]).await;
    assert_eq!(ran.stdout, "nothing to show: -n 0\n", "{ran:?}");
    let ran = live.run(&["peek", &queue]).await;
    assert!(ran.stdout.contains("has no message ready"), "{ran:?}");
    live.delete(&[&queue, &dead]).await;
}

/// A run whose standard output is a pipe nobody reads any more (`| head`): it must end by
/// itself, without a word on standard error, and exit 0.
async fn ends_quietly(child: tokio::process::Child, what: &str) {
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} ends within the deadline once its reader is gone"))
        .expect("its output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    assert_eq!(output.status.code(), Some(0), "{what}: {stderr}");
    assert_eq!(stderr, "", "{what}");
}

/// A pipe whose reading end is closed already, for a child's standard output.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    writer
}

/// `conveyor peek … | head`: when the reader goes away, peek stops showing, hands back
/// every message it holds (at once, not after SQS's visibility timeout), and exits 0
/// without a panic; `depth`, once and `--watch`, ends the same way.
async fn peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly<B: Broker>(live: Live<B>) {
    use tokio::io::AsyncReadExt;

    const COUNT: u64 = 6;
    // Well inside SQS's visibility timeout (30 s): a message left held would not be back.
    const BACK_WITHIN: Duration = Duration::from_secs(10);
    let queue = live.declare("peek-pipe").await;
    // 24 KiB a body: the six shown are more than a pipe holds (64 KiB), so a reader gone
    // after the first bytes is seen while peek holds messages.
    let padding = "x".repeat(24 * 1024);
    for id in 0..COUNT {
        let message = Message::builder()
            .partition_key(format!("k{id}"))
            .json(&serde_json::json!({ "id": id, "padding": padding }))
            .expect("JSON encodes");
        live.broker
            .publish(&queue, message)
            .await
            .expect("published");
    }
    live.wait_ready(&queue, COUNT).await;
    let count = COUNT.to_string();

    // The reader gone before peek writes a byte.
    let mut command = live.command(&["peek", &queue, "-n", &count]);
    command.stdout(closed_pipe());
    let child = command.spawn().expect("peek starts");
    drop(command);
    ends_quietly(child, "peek into a closed pipe").await;
    live.wait_ready_within(&queue, COUNT, BACK_WITHIN).await;

    // The reader gone after the first bytes, as `| head -1` does.
    let mut child = live
        .command(&["peek", &queue, "-n", &count])
        .spawn()
        .expect("peek starts");
    let mut stdout = child.stdout.take().expect("a piped stdout");
    let mut chunk = [0u8; 1024];
    let read = tokio::time::timeout(DEADLINE, stdout.read(&mut chunk))
        .await
        .expect("peek writes within the deadline")
        .expect("stdout reads");
    assert!(read > 0, "peek wrote nothing");
    drop(stdout);
    ends_quietly(child, "peek whose reader went away").await;
    live.wait_ready_within(&queue, COUNT, BACK_WITHIN).await;

    for args in [&["depth", &queue][..], &["depth", &queue, "--watch", "0.1"]] {
        let mut command = live.command(args);
        command.stdout(closed_pipe());
        let child = command.spawn().expect("depth starts");
        drop(command);
        ends_quietly(child, &args.join(" ")).await;
    }
    live.delete(&[&queue]).await;
}

async fn publish_sends_one_message_or_one_per_line<B: Broker>(live: Live<B>) {
    let queue = live.declare("publish").await;
    let ran = live
        .run_with_input(
            &[
                "publish",
                &queue,
                "--key",
                "alice",
                "--header",
                "x-tenant=acme",
            ],
            Some(br#"{"id": 7}"#),
        )
        .await;
    assert!(ran.status.success(), "{ran:?}");
    assert_eq!(
        ran.stdout.trim(),
        format!("published 1 message to `{queue}`")
    );
    let lines = b"first line\n\nsecond line\r\nthird line\n";
    let ran = live
        .run_with_input(
            &["publish", &queue, "--key", "bob", "--lines", "-"],
            Some(lines),
        )
        .await;
    assert!(ran.status.success(), "{ran:?}");
    assert!(ran.stdout.contains("published 3 messages"), "{ran:?}");

    let taken = live.take(&queue, 4).await;
    let json = taken
        .iter()
        .find(|m| m.payload.as_ref() == br#"{"id": 7}"#)
        .expect("the JSON message");
    assert_eq!(
        json.partition_key.as_ref().map(|k| k.as_str()),
        Some("alice")
    );
    assert_eq!(json.headers.get_str("x-tenant"), Some("acme"));
    assert_eq!(
        json.headers.get_str(conveyor::CONTENT_TYPE_HEADER),
        Some("application/json")
    );
    let mut texts: Vec<&[u8]> = taken.iter().map(|m| m.payload.as_ref()).collect();
    texts.sort();
    assert_eq!(
        texts,
        [
            &b"first line"[..],
            b"second line",
            b"third line",
            br#"{"id": 7}"#
        ]
    );
    live.delete(&[&queue]).await;
}

/// `publish --lines` checks every line before it sends any: a line SQS cannot carry (a
/// binary one, which needs an attribute more for its base64 than the ten headers leave)
/// fails the run with none sent, and the error says how many of the input were
/// published and which lines were not, numbered as in the input.
async fn publish_lines_checks_every_line_before_sending_any<B: Broker>(live: Live<B>) {
    let queue = live.declare("publish-bad-line").await;
    let mut input = Vec::new();
    for n in 1..=550 {
        input.extend_from_slice(format!("line {n}\n").as_bytes());
    }
    // Line 551 is empty (skipped), line 552 binary.
    input.extend_from_slice(b"\n\xff\xfe\n");
    for n in 553..=601 {
        input.extend_from_slice(format!("line {n}\n").as_bytes());
    }
    let mut args = vec!["publish", &queue, "--key", "k", "--lines", "-"];
    let headers: Vec<String> = (0..10).map(|n| format!("h{n}=v")).collect();
    for header in &headers {
        args.extend(["--header", header.as_str()]);
    }
    let ran = live.run_with_input(&args, Some(&input)).await;
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains(&format!(
            "published 0 of 600 to `{queue}`; not sent: lines 1-550, 552-601: "
        )),
        "{ran:?}"
    );
    assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{ran:?}");
    // Nothing arrived: the command ended with every send answered.
    assert_eq!(live.ready(&queue).await, 0, "a line was sent");
    live.delete(&[&queue]).await;
}

async fn redrive_moves_dead_letters_back_marked_and_keeps_the_rest<B: Broker>(live: Live<B>) {
    let (queue, dead) = live.declare_with_dead_letters("redrive").await;
    let messages = (0..6)
        .map(|id| json(id, if id % 2 == 0 { "acme" } else { "globex" }))
        .collect();
    dead_letter(&live, &queue, &dead, messages).await;

    // A dry run shows what would move and moves nothing.
    let ran = live
        .redrive(&dead, &queue, &["--filter", "x-tenant=acme", "--dry-run"])
        .await;
    assert!(ran.status.success(), "{ran:?}");
    assert!(ran.stdout.contains("would move 3 of 6"), "{ran:?}");
    live.wait_ready(&dead, 6).await;
    assert_eq!(live.ready(&queue).await, 0);

    // Two of acme's three, then the rest of acme's.
    let ran = live
        .redrive(
            &dead,
            &queue,
            &["--filter", "x-tenant=acme", "--limit", "2"],
        )
        .await;
    assert!(ran.status.success(), "{ran:?}");
    assert!(ran.stdout.contains("moved 2 of "), "{ran:?}");
    live.wait_ready(&dead, 4).await;
    let ran = live
        .redrive(&dead, &queue, &["--filter", "x-tenant=acme"])
        .await;
    assert!(ran.status.success(), "{ran:?}");
    live.wait_ready(&dead, 3).await;

    let moved = live.take(&queue, 3).await;
    let mut ids: Vec<u64> = moved.iter().map(id_of).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 2, 4]);
    for message in &moved {
        assert_eq!(message.headers.get_str("x-conveyor-redriven"), Some("1"));
        assert_eq!(message.headers.get_str("x-tenant"), Some("acme"));
        let id = id_of(message);
        let key = format!("k{id}");
        assert_eq!(
            message.partition_key.as_ref().map(|k| k.as_str()),
            Some(key.as_str())
        );
        assert_eq!(
            message.headers.get_str(conveyor::MESSAGE_ID_HEADER),
            Some(format!("m-{id}.redrive-1").as_str())
        );
        // The attempts that sent it to the dead-letter queue are not carried back.
        assert!(!message.headers.contains(conveyor_lapin::ATTEMPTS_HEADER));
    }
    live.delete(&[&queue, &dead]).await;
}

/// `--rate N` leaves at least 1/N s between two moves: four moves at two a second take
/// three pauses of half a second. A lower bound, which a slow machine only passes more
/// easily; unpaced, the same redrive takes a fraction of that.
async fn redrive_at_a_rate_pauses_between_moves<B: Broker>(live: Live<B>) {
    let (queue, dead) = live.declare_with_dead_letters("paced").await;
    dead_letter(
        &live,
        &queue,
        &dead,
        (0..4).map(|id| json(id, "acme")).collect(),
    )
    .await;

    let started = std::time::Instant::now();
    let ran = live.redrive(&dead, &queue, &["--rate", "2"]).await;
    let took = started.elapsed();
    assert!(ran.status.success(), "{ran:?}");
    assert!(ran.stdout.contains("moved 4 of 4"), "{ran:?}");
    assert!(took >= Duration::from_millis(1_500), "took {took:?}");
    live.wait_ready(&queue, 4).await;
    live.delete(&[&queue, &dead]).await;
}

/// A rate that is no positive number of messages a second, or one so high that the
/// pause between two moves would be zero, is a usage error that moves nothing.
async fn redrive_refuses_a_rate_that_is_not_a_positive_number<B: Broker>(live: Live<B>) {
    let (queue, dead) = live.declare_with_dead_letters("bad-rate").await;
    dead_letter(&live, &queue, &dead, vec![json(0, "acme")]).await;

    for rate in [
        "--rate=0",
        "--rate=-1",
        "--rate=NaN",
        "--rate=inf",
        "--rate=1e10",
    ] {
        let ran = live.redrive(&dead, &queue, &[rate]).await;
        assert_eq!(ran.status.code(), Some(2), "{rate}: {ran:?}");
        assert!(ran.stderr.contains("--rate"), "{rate}: {ran:?}");
        assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{rate}: {ran:?}");
    }
    live.wait_ready(&dead, 1).await;
    assert_eq!(live.ready(&queue).await, 0, "a message moved");
    live.delete(&[&queue, &dead]).await;
}

/// `total` dead letters in a new dead-letter queue, and a redrive of them to a new target
/// paced at 20 a second, once its first message has arrived: (dlq, target, the redrive).
/// Paced so that it is still moving when the test stops it: hundreds at 20 a second take
/// ten seconds and more, and the test acts on the first arrival.
async fn a_redrive_under_way<B: Broker>(
    live: &Live<B>,
    stem: &str,
    total: u32,
) -> (String, String, tokio::process::Child) {
    let dead = live.declare(&format!("{stem}-dead")).await;
    let target = live.declare(stem).await;
    let messages: Vec<Message> = (0..total).map(|id| json(id, "acme")).collect();
    for chunk in messages.chunks(100) {
        live.broker
            .publish_batch(&dead, chunk.to_vec())
            .await
            .expect("published");
    }
    live.wait_ready(&dead, u64::from(total)).await;
    let child = live
        .command(&["redrive", &dead, "--to", &target, "--rate", "20"])
        .spawn()
        .expect("the redrive starts");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while live.ready(&target).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "nothing moved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (dead, target, child)
}

async fn an_interrupted_redrive_run_again_moves_each_message_exactly_once<B: Broker>(
    live: Live<B>,
) {
    const TOTAL: u32 = 400;
    let (dead, target, child) = a_redrive_under_way(&live, "interrupted", TOTAL).await;
    let pid = child.id().expect("a running redrive").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("the interrupted redrive ends")
        .expect("its output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.starts_with("conveyor: error: interrupted: moved "),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");

    // Everything is in one queue or the other: what was held went back.
    let moved = live.ready(&target).await;
    assert!(moved > 0 && moved < u64::from(TOTAL), "{moved} moved");
    live.wait_ready(&dead, u64::from(TOTAL) - moved).await;

    let ran = live.redrive(&dead, &target, &[]).await;
    assert!(ran.status.success(), "{ran:?}");
    live.wait_ready(&dead, 0).await;
    let taken = live.take(&target, TOTAL as usize).await;
    let mut ids: Vec<u64> = taken.iter().map(id_of).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..u64::from(TOTAL)).collect::<Vec<_>>(),
        "each exactly once"
    );
    assert_eq!(live.ready(&target).await, 0, "nothing more in the target");
    live.delete(&[&dead, &target]).await;
}

/// Killed outright (SIGKILL) mid-way, a redrive loses nothing: what it held goes back to
/// the dead-letter queue, and the next run moves it. A message published whose removal
/// had not reached the broker yet arrives twice (at least once).
async fn a_killed_redrive_run_again_loses_nothing<B: Broker>(live: Live<B>) {
    const TOTAL: u32 = 200;
    let (dead, target, mut child) = a_redrive_under_way(&live, "killed", TOTAL).await;
    child.kill().await.expect("SIGKILL");
    let moved = live.ready(&target).await;
    assert!(
        moved < u64::from(TOTAL),
        "the redrive ended before the kill"
    );

    // The broker takes back what the dead connection held; then a second run moves it.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while live.ready(&dead).await + live.ready(&target).await < u64::from(TOTAL) {
        assert!(tokio::time::Instant::now() < deadline, "messages stay held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ran = live.redrive(&dead, &target, &[]).await;
    assert!(ran.status.success(), "{ran:?}");
    live.wait_ready(&dead, 0).await;
    let arrived = usize::try_from(live.ready(&target).await).expect("a count");
    let taken = live.take(&target, arrived).await;
    let mut ids: Vec<u64> = taken.iter().map(id_of).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids, (0..u64::from(TOTAL)).collect::<Vec<_>>(), "none lost");
    // At least once: those whose removal had not reached the broker came twice.
    println!("{} of {TOTAL} moved twice", before - ids.len());
    live.delete(&[&dead, &target]).await;
}

/// SQS carries at most ten message attributes: a dead letter with nine or ten (headers,
/// content type, message id) has no room for the marker and a new id, and moves without
/// what does not fit; the messages after it move too, each once.
async fn redrive_moves_crowded_dead_letters_and_leaves_one_with_no_room_for_an_id<B: Broker>(
    live: Live<B>,
) {
    let dead = live.declare("full-dead").await;
    let target = live.declare("full").await;
    let crowded = |id: u32, headers: u32, message_id: bool| {
        let mut builder = Message::builder().partition_key(format!("k{id}"));
        for n in 0..headers {
            builder = builder.header(format!("h{n}"), "v");
        }
        if message_id {
            builder = builder.message_id(format!("m-{id}"));
        }
        builder.payload(format!("body {id}"))
    };
    // Nine headers, no id; nine and an id; ten, no id; then a plain one.
    let messages = vec![
        crowded(0, 9, false),
        crowded(1, 9, true),
        crowded(2, 10, false),
        crowded(3, 0, false),
    ];
    live.broker
        .publish_batch(&dead, messages)
        .await
        .expect("published");
    live.wait_ready(&dead, 4).await;

    let ran = live.redrive(&dead, &target, &[]).await;
    // Ten headers and no id leave no room for the id a redrive gives (without one, a FIFO
    // queue deduplicating by content could drop another of the same body): that one
    // stays, and the pass moves the rest.
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("moved 3 of 4") && ran.stderr.contains("1 could not be sent and stays"),
        "{ran:?}"
    );
    live.wait_ready(&dead, 1).await;
    let stayed = live.take(&dead, 1).await;
    assert_eq!(stayed[0].payload.as_ref(), b"body 2");
    let moved = live.take(&target, 3).await;
    let mut bodies: Vec<&[u8]> = moved.iter().map(|m| m.payload.as_ref()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, [&b"body 0"[..], b"body 1", b"body 3"]);
    for message in &moved {
        let id = message.headers.get_str(conveyor::MESSAGE_ID_HEADER);
        match message.payload.as_ref() {
            b"body 1" => assert_eq!(id, Some("m-1.redrive-1")),
            b"body 3" => {
                assert_eq!(message.headers.get_str("x-conveyor-redriven"), Some("1"));
            }
            _ => {}
        }
    }
    assert_eq!(live.ready(&target).await, 0, "each moved once");
    live.delete(&[&dead, &target]).await;
}

async fn failures_are_one_line_and_never_show_a_password<B: Broker>(live: Live<B>) {
    let ran = live.run(&["depth", "no-such-queue-anywhere"]).await;
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    assert!(ran.stderr.starts_with("conveyor: error: "), "{ran:?}");
    assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{ran:?}");
    assert!(ran.stderr.contains("no-such-queue-anywhere"), "{ran:?}");
    // A redrive to a queue that does not exist takes nothing out.
    let dead = live.declare("orphan-dead").await;
    live.broker
        .publish(&dead, json(1, "acme"))
        .await
        .expect("published");
    live.wait_ready(&dead, 1).await;
    let ran = live.redrive(&dead, "no-such-queue-anywhere", &[]).await;
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    live.wait_ready(&dead, 1).await;
    live.delete(&[&dead]).await;
}

mod rabbitmq {
    use super::*;

    #[tokio::test]
    async fn depth_prints_each_queues_counts() {
        super::depth_prints_each_queues_counts(rabbitmq().await).await;
    }

    #[tokio::test]
    async fn depth_watch_redraws_the_table_in_place_until_interrupted() {
        super::depth_watch_redraws_the_table_in_place_until_interrupted(rabbitmq().await).await;
    }

    #[tokio::test]
    async fn peek_shows_messages_and_leaves_them_in_the_queue() {
        super::peek_shows_messages_and_leaves_them_in_the_queue(rabbitmq().await).await;
    }

    #[tokio::test]
    async fn peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly() {
        super::peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly(rabbitmq().await)
            .await;
    }

    #[tokio::test]
    async fn publish_sends_one_message_or_one_per_line() {
        super::publish_sends_one_message_or_one_per_line(rabbitmq().await).await;
    }

    #[tokio::test]
    async fn redrive_moves_dead_letters_back_marked_and_keeps_the_rest() {
        super::redrive_moves_dead_letters_back_marked_and_keeps_the_rest(rabbitmq().await).await;
    }

    #[tokio::test]
    async fn an_interrupted_redrive_run_again_moves_each_message_exactly_once() {
        super::an_interrupted_redrive_run_again_moves_each_message_exactly_once(rabbitmq().await)
            .await;
    }

    #[tokio::test]
    async fn redrive_at_a_rate_pauses_between_moves() {
        super::redrive_at_a_rate_pauses_between_moves(rabbitmq().await).await;
    }

    #[tokio::test]
    async fn redrive_refuses_a_rate_that_is_not_a_positive_number() {
        super::redrive_refuses_a_rate_that_is_not_a_positive_number(rabbitmq().await).await;
    }

    #[tokio::test]
    async fn a_killed_redrive_run_again_loses_nothing() {
        super::a_killed_redrive_run_again_loses_nothing(rabbitmq().await).await;
    }

    /// A redriven message keeps its AMQP properties (content encoding, type, app id,
    /// timestamp, priority as the property) and its headers' types (numbers, booleans,
    /// arrays, tables), as README says it keeps its headers.
    #[tokio::test]
    async fn redrive_keeps_amqp_properties_and_header_types() {
        use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
        use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
        use lapin::{BasicProperties, Connection, ConnectionProperties};

        let live = rabbitmq().await;
        let dead = live.declare("typed-dead").await;
        let target = live.declare("typed").await;
        let connection = Connection::connect(AMQP_URL, ConnectionProperties::default())
            .await
            .expect("a lapin connection");
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        let mut nested = FieldTable::default();
        nested.insert("inner".into(), AMQPValue::LongInt(1));
        let mut headers = FieldTable::default();
        headers.insert("count".into(), AMQPValue::LongLongInt(7));
        headers.insert("flag".into(), AMQPValue::Boolean(true));
        headers.insert(
            "list".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(
                LongString::from("a"),
            )])),
        );
        headers.insert("table".into(), AMQPValue::FieldTable(nested));
        let properties = BasicProperties::default()
            .with_headers(headers)
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_type("order.created".into())
            .with_app_id("shop".into())
            .with_timestamp(1_700_000_000)
            .with_priority(5)
            .with_message_id("m-typed".into());
        channel
            .basic_publish(
                "".into(),
                dead.as_str().into(),
                BasicPublishOptions::default(),
                b"{}",
                properties,
            )
            .await
            .expect("published")
            .await
            .expect("confirmed");
        live.wait_ready(&dead, 1).await;

        let ran = live.redrive(&dead, &target, &[]).await;
        assert!(ran.status.success(), "{ran:?}");
        live.wait_ready(&target, 1).await;
        let got = channel
            .basic_get(target.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("a get")
            .expect("the redriven message");
        let properties = &got.delivery.properties;
        assert_eq!(
            properties.content_encoding().as_ref().map(|v| v.as_str()),
            Some("gzip")
        );
        assert_eq!(
            properties.kind().as_ref().map(|v| v.as_str()),
            Some("order.created")
        );
        assert_eq!(
            properties.app_id().as_ref().map(|v| v.as_str()),
            Some("shop")
        );
        assert_eq!(*properties.timestamp(), Some(1_700_000_000));
        assert_eq!(*properties.priority(), Some(5));
        let table = properties.headers().clone().unwrap_or_default();
        let table = table.inner();
        assert!(!table.contains_key("priority"), "{table:?}");
        assert_eq!(table.get("count"), Some(&AMQPValue::LongLongInt(7)));
        assert_eq!(table.get("flag"), Some(&AMQPValue::Boolean(true)));
        assert!(
            matches!(table.get("list"), Some(AMQPValue::FieldArray(_))),
            "{table:?}"
        );
        assert!(
            matches!(table.get("table"), Some(AMQPValue::FieldTable(_))),
            "{table:?}"
        );
        let _ = connection.close(200, "done".into()).await;
        live.delete(&[&dead, &target]).await;
    }

    #[tokio::test]
    async fn failures_are_one_line_and_never_show_a_password() {
        super::failures_are_one_line_and_never_show_a_password(rabbitmq().await).await;
        // A refused login names the URL with its password hidden.
        let live = Live {
            broker: rabbitmq().await.broker,
            url: "amqp://guest:hunter2-secret@127.0.0.1:5672/%2f",
            fifo: false,
            handed_back_in_flight: false,
        };
        let ran = live.run(&["depth", "anything"]).await;
        assert_eq!(ran.status.code(), Some(1), "{ran:?}");
        assert!(
            ran.stderr.contains("amqp://guest:***@127.0.0.1:5672"),
            "{ran:?}"
        );
        assert!(!ran.stderr.contains("hunter2"), "{ran:?}");
        assert!(!ran.stdout.contains("hunter2"), "{ran:?}");
    }

    /// RabbitMQ returns a message no queue takes (here, to a queue that does not
    /// exist): one message returned certainly did not arrive. Of several, the error does
    /// not say which came back, so those may or may not have arrived.
    #[tokio::test]
    async fn a_returned_message_is_reported_as_not_sent() {
        let live = rabbitmq().await;
        let queue = unique("nowhere");
        let ran = live.run_with_input(&["publish", &queue], Some(b"{}")).await;
        assert_one_message_not_sent(&ran, &queue);
        assert!(ran.stderr.contains("returned unroutable"), "{ran:?}");

        let ran = live
            .run_with_input(&["publish", &queue, "--lines"], Some(b"a\nb\n"))
            .await;
        assert_eq!(ran.status.code(), Some(1), "{ran:?}");
        assert!(
            ran.stderr
                .contains("; may or may not have arrived: lines 1-2: "),
            "{ran:?}"
        );
    }

    /// `ran`, a one-message publish to `queue`, failed and said the message was not sent.
    fn assert_one_message_not_sent(ran: &Ran, queue: &str) {
        assert_eq!(ran.status.code(), Some(1), "{ran:?}");
        assert!(
            ran.stderr.contains(&format!(
                "published 0 of 1 to `{queue}` (the file as one message); not sent: line 1: "
            )),
            "{ran:?}"
        );
    }

    /// A message its queue refused (full, `reject-publish`) is nacked: it did not arrive.
    /// (It was reported as "may or may not have arrived".)
    #[tokio::test]
    async fn a_message_its_full_queue_refused_is_reported_as_not_sent() {
        use conveyor_lapin::RabbitQueueSpec;

        let live = rabbitmq().await;
        let queue = live.name("full");
        live.broker
            .declare_queue(
                &QueueSpec::new(queue.as_str())
                    .argument("x-max-length", 1)
                    .argument("x-overflow", "reject-publish"),
            )
            .await
            .expect("the queue is declared");
        let ran = live.run_with_input(&["publish", &queue], Some(b"{}")).await;
        assert!(ran.status.success(), "{ran:?}");
        let ran = live.run_with_input(&["publish", &queue], Some(b"{}")).await;
        assert_one_message_not_sent(&ran, &queue);
        live.delete(&[&queue]).await;
    }
}

mod sqs {
    use super::*;

    #[tokio::test]
    async fn depth_prints_each_queues_counts() {
        super::depth_prints_each_queues_counts(sqs().await).await;
    }

    #[tokio::test]
    async fn depth_watch_redraws_the_table_in_place_until_interrupted() {
        super::depth_watch_redraws_the_table_in_place_until_interrupted(sqs().await).await;
    }

    #[tokio::test]
    async fn peek_shows_messages_and_leaves_them_in_the_queue() {
        super::peek_shows_messages_and_leaves_them_in_the_queue(sqs().await).await;
    }

    #[tokio::test]
    async fn peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly() {
        super::peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly(sqs().await).await;
    }

    #[tokio::test]
    async fn publish_sends_one_message_or_one_per_line() {
        super::publish_sends_one_message_or_one_per_line(sqs().await).await;
    }

    #[tokio::test]
    async fn redrive_moves_dead_letters_back_marked_and_keeps_the_rest() {
        super::redrive_moves_dead_letters_back_marked_and_keeps_the_rest(sqs().await).await;
    }

    #[tokio::test]
    async fn an_interrupted_redrive_run_again_moves_each_message_exactly_once() {
        super::an_interrupted_redrive_run_again_moves_each_message_exactly_once(sqs().await).await;
    }

    #[tokio::test]
    async fn failures_are_one_line_and_never_show_a_password() {
        super::failures_are_one_line_and_never_show_a_password(sqs().await).await;
    }

    #[tokio::test]
    async fn publish_lines_checks_every_line_before_sending_any() {
        super::publish_lines_checks_every_line_before_sending_any(sqs().await).await;
    }

    /// A standard queue has no message groups, so SQS would take the message and drop
    /// its key: `publish --key` to one is a usage error that says why, and sends
    /// nothing. (The FIFO queues of `publish_sends_one_message_or_one_per_line` keep it.)
    #[tokio::test]
    async fn publish_with_a_key_to_a_standard_queue_is_refused_and_sends_nothing() {
        let live = sqs().await;
        let queue = unique("standard-key");
        live.broker
            .declare_queue(&QueueSpec::new(queue.as_str()))
            .await
            .expect("the queue is declared");
        // The body in a file: the command refuses before it reads any input, so a pipe
        // to its standard input could be closed before the test had written to it.
        let body = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{queue}.json"));
        std::fs::write(&body, br#"{"id": 1}"#).expect("the body is written");
        let body = body.to_str().expect("a UTF-8 path");

        let ran = live.run(&["publish", &queue, "--key", "alice", body]).await;
        assert_eq!(ran.status.code(), Some(2), "{ran:?}");
        assert!(
            ran.stderr.contains("--key") && ran.stderr.contains("standard SQS queue"),
            "{ran:?}"
        );
        assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{ran:?}");
        assert_eq!(live.ready(&queue).await, 0, "a message was sent");

        let ran = live.run(&["publish", &queue, body]).await;
        assert!(ran.status.success(), "{ran:?}");
        live.wait_ready(&queue, 1).await;
        live.delete(&[&queue]).await;
        let _ = std::fs::remove_file(body);
    }

    #[tokio::test]
    async fn redrive_moves_crowded_dead_letters_and_leaves_one_with_no_room_for_an_id() {
        super::redrive_moves_crowded_dead_letters_and_leaves_one_with_no_room_for_an_id(
            sqs().await,
        )
        .await;
    }

    /// A redriven message keeps the SQS data types of its attributes (`Number`, custom
    /// types, `Binary` holding text), which the portable message would send as `String`.
    #[tokio::test]
    async fn redrive_keeps_the_data_types_of_message_attributes() {
        use conveyor::{Settlement, Source, SubscribeSettings, Subscriber};
        use conveyor_sqs::AttributeTypes;

        let live = sqs().await;
        let (dead, target) = (unique("typed-dead"), unique("typed"));
        for queue in [&dead, &target] {
            live.broker
                .declare_queue(&QueueSpec::new(queue.as_str()))
                .await
                .expect("the queue is declared");
        }
        let types = AttributeTypes::new()
            .with("price", "Number")
            .with("meta", "String.json")
            .with("digest", "Binary");
        let message = Message::builder()
            .message_id("42")
            .header("price", "12.5")
            .header("meta", r#"{"a":1}"#)
            .header("digest", "looks like text")
            .header("x-tenant", "acme")
            .payload("{}");
        // A numeric id too: the redrive's new id (`42.redrive-1`) is no number, and
        // goes as text.
        let numeric_id = types.clone().with(conveyor::MESSAGE_ID_HEADER, "Number");
        live.broker
            .publish_typed(&dead, message, &numeric_id)
            .await
            .expect("the dead letter is published");
        live.wait_ready(&dead, 1).await;

        let ran = live.redrive(&dead, &target, &[]).await;
        assert!(ran.status.success(), "{ran:?}");
        live.wait_ready(&target, 1).await;
        let mut subscriber = live
            .broker
            .queue(target.as_str())
            .subscribe(SubscribeSettings::new(1))
            .await
            .expect("a subscription");
        let delivery = subscriber
            .recv()
            .await
            .expect("a receive")
            .expect("the redriven message");
        assert_eq!(
            conveyor_sqs::attribute_types(&delivery),
            Some(types),
            "{:?}",
            delivery.headers()
        );
        assert_eq!(delivery.headers().get_str("price"), Some("12.5"));
        assert_eq!(delivery.headers().get_str("x-tenant"), Some("acme"));
        delivery.settle(Settlement::Ack);
        subscriber.close().await;
        live.delete(&[&dead, &target]).await;
    }
}

mod nats {
    use super::*;

    #[tokio::test]
    async fn depth_prints_each_queues_counts() {
        super::depth_prints_each_queues_counts(nats().await).await;
    }

    #[tokio::test]
    async fn depth_watch_redraws_the_table_in_place_until_interrupted() {
        super::depth_watch_redraws_the_table_in_place_until_interrupted(nats().await).await;
    }

    #[tokio::test]
    async fn peek_shows_messages_and_leaves_them_in_the_queue() {
        super::peek_shows_messages_and_leaves_them_in_the_queue(nats().await).await;
    }

    #[tokio::test]
    async fn peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly() {
        super::peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly(nats().await).await;
    }

    /// A peek is a fetch and a nak: JetStream delivers the messages again at once (a
    /// second peek shows them all, where messages left held would not come back for the
    /// ack wait, longer than a pass waits), and counts each peek as a delivery. A peek
    /// whose reader went away hands them back at once too.
    #[tokio::test]
    async fn a_peek_hands_the_messages_back_at_once_and_counts_as_a_delivery() {
        let live = nats().await;
        let queue = live.declare("peek-again").await;
        live.broker
            .publish_batch(&queue, vec![json(1, "acme"), json(2, "globex")])
            .await
            .expect("published");
        live.wait_ready(&queue, 2).await;
        for attempt in 1..=2 {
            let ran = live.run(&["peek", &queue, "-n", "5"]).await;
            assert!(ran.status.success(), "{ran:?}");
            assert!(ran.stdout.contains("2 shown of 2 ready"), "{ran:?}");
            assert_eq!(
                ran.stdout.matches(&format!("attempt: {attempt}\n")).count(),
                2,
                "{ran:?}"
            );
        }
        let mut command = live.command(&["peek", &queue, "-n", "5"]);
        command.stdout(closed_pipe());
        let child = command.spawn().expect("peek starts");
        drop(command);
        ends_quietly(child, "peek into a closed pipe").await;
        let ran = live.run(&["peek", &queue, "-n", "5"]).await;
        assert!(ran.stdout.contains("2 shown of 2 ready"), "{ran:?}");
        let taken = live.take(&queue, 2).await;
        assert_eq!(taken.len(), 2);
        assert_eq!(live.ready(&queue).await, 0);
        live.delete(&[&queue]).await;
    }

    #[tokio::test]
    async fn publish_sends_one_message_or_one_per_line() {
        super::publish_sends_one_message_or_one_per_line(nats().await).await;
    }

    /// JetStream would make the stream of a subject no stream takes: `publish` looks the
    /// queue up first, so a mistyped name is an error that sends nothing and makes no
    /// queue, as on RabbitMQ and SQS.
    #[tokio::test]
    async fn a_publish_to_a_queue_that_does_not_exist_fails_and_makes_none() {
        let live = nats().await;
        let queue = unique("nowhere");
        // The body in a file: the command fails before it reads any input, so a pipe to
        // its standard input could be closed before the test had written to it.
        let body = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{queue}.json"));
        std::fs::write(&body, br#"{"id": 1}"#).expect("the body is written");
        let body = body.to_str().expect("a UTF-8 path");

        let ran = live.run(&["publish", &queue, body]).await;
        assert_eq!(ran.status.code(), Some(1), "{ran:?}");
        assert!(ran.stderr.contains(&format!("`{queue}`")), "{ran:?}");
        assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{ran:?}");
        assert!(
            live.broker.queue_depth(&queue).await.is_err(),
            "the publish made `{queue}`"
        );
        let _ = std::fs::remove_file(body);
    }

    #[tokio::test]
    async fn redrive_moves_dead_letters_back_marked_and_keeps_the_rest() {
        super::redrive_moves_dead_letters_back_marked_and_keeps_the_rest(nats().await).await;
    }

    #[tokio::test]
    async fn an_interrupted_redrive_run_again_moves_each_message_exactly_once() {
        super::an_interrupted_redrive_run_again_moves_each_message_exactly_once(nats().await).await;
    }

    #[tokio::test]
    async fn redrive_at_a_rate_pauses_between_moves() {
        super::redrive_at_a_rate_pauses_between_moves(nats().await).await;
    }

    #[tokio::test]
    async fn redrive_refuses_a_rate_that_is_not_a_positive_number() {
        super::redrive_refuses_a_rate_that_is_not_a_positive_number(nats().await).await;
    }

    #[tokio::test]
    async fn failures_are_one_line_and_never_show_a_password() {
        super::failures_are_one_line_and_never_show_a_password(nats().await).await;
        // A server that cannot be reached is named with its password or token hidden
        // (nothing listens on port 1).
        for url in [
            "nats://app:hunter2-secret@127.0.0.1:1",
            "nats://hunter2-secret@127.0.0.1:1",
        ] {
            let live = Live {
                broker: nats().await.broker,
                url,
                fifo: false,
                handed_back_in_flight: true,
            };
            let ran = live.run(&["depth", "anything"]).await;
            assert_eq!(ran.status.code(), Some(1), "{ran:?}");
            assert!(ran.stderr.contains("127.0.0.1:1"), "{ran:?}");
            assert!(ran.stderr.contains("***@127.0.0.1:1"), "{ran:?}");
            assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{ran:?}");
            assert!(!ran.stderr.contains("hunter2"), "{ran:?}");
            assert!(!ran.stdout.contains("hunter2"), "{ran:?}");
        }
    }
}

mod redis {
    use super::*;

    #[tokio::test]
    async fn depth_prints_each_queues_counts() {
        super::depth_prints_each_queues_counts(redis().await).await;
    }

    #[tokio::test]
    async fn depth_watch_redraws_the_table_in_place_until_interrupted() {
        super::depth_watch_redraws_the_table_in_place_until_interrupted(redis().await).await;
    }

    #[tokio::test]
    async fn peek_shows_messages_and_leaves_them_in_the_queue() {
        super::peek_shows_messages_and_leaves_them_in_the_queue(redis().await).await;
    }

    #[tokio::test]
    async fn peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly() {
        super::peek_into_a_closed_pipe_hands_everything_back_and_exits_quietly(redis().await).await;
    }

    /// A peeked entry is handed back claimable at once (its idle time set past any
    /// lease): `depth` counts it ready again, with nothing in flight, and a second peek
    /// shows it, where an entry left held would not come back for its lease (30 s),
    /// longer than a pass waits. Redis counts each peek as a delivery.
    #[tokio::test]
    async fn a_peek_hands_the_messages_back_ready_at_once_and_counts_as_a_delivery() {
        let live = redis().await;
        let queue = live.declare("peek-again").await;
        live.broker
            .publish_batch(&queue, vec![json(1, "acme"), json(2, "globex")])
            .await
            .expect("published");
        live.wait_ready(&queue, 2).await;
        for attempt in 1..=2 {
            let ran = live.run(&["peek", &queue, "-n", "5"]).await;
            assert!(ran.status.success(), "{ran:?}");
            assert!(ran.stdout.contains("2 shown of 2 ready"), "{ran:?}");
            assert_eq!(
                ran.stdout.matches(&format!("attempt: {attempt}\n")).count(),
                2,
                "{ran:?}"
            );
            let depth = live.broker.queue_depth(&queue).await.expect("a depth");
            assert_eq!(
                (depth.ready, depth.in_flight),
                (2, Some(0)),
                "after peek {attempt}"
            );
        }
        let ran = live.run(&["depth", &queue]).await;
        assert!(ran.status.success(), "{ran:?}");
        let row: Vec<&str> = ran
            .stdout
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(row, [queue.as_str(), "2", "0", "0"], "{ran:?}");
        // Both still there, and nothing more. (Not by the depth: `take_dead_letters`
        // deletes the entries but leaves them pending in the group, which the depth
        // counts ready until a receive clears them.)
        let taken = live.take(&queue, 2).await;
        assert_eq!(taken.len(), 2);
        let more = live
            .broker
            .take_dead_letters(&queue, 10)
            .await
            .expect("taken");
        assert!(more.is_empty(), "{} more", more.len());
        live.delete(&[&queue]).await;
    }

    #[tokio::test]
    async fn publish_sends_one_message_or_one_per_line() {
        super::publish_sends_one_message_or_one_per_line(redis().await).await;
    }

    /// `XADD` would make the stream of a name Redis does not hold, and Redis answers a
    /// depth of zeros for it: every command looks the queue up first, so a mistyped
    /// name is a one-line error that sends nothing and makes no queue, as on RabbitMQ
    /// and SQS.
    #[tokio::test]
    async fn a_queue_that_does_not_exist_is_an_error_and_is_not_made() {
        let live = redis().await;
        let queue = unique("nowhere");
        let dead = live.declare("nowhere-dead").await;
        live.broker
            .publish(&dead, json(1, "acme"))
            .await
            .expect("published");
        live.wait_ready(&dead, 1).await;
        // The body in a file: the command fails before it reads any input, so a pipe to
        // its standard input could be closed before the test had written to it.
        let body = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{queue}.json"));
        std::fs::write(&body, br#"{"id": 1}"#).expect("the body is written");
        let body = body.to_str().expect("a UTF-8 path");

        for args in [
            &["publish", &queue, body][..],
            &["depth", &queue],
            &["peek", &queue],
            &["redrive", &queue, "--to", &dead],
            &["redrive", &dead, "--to", &queue],
        ] {
            let ran = live.run(args).await;
            assert_eq!(ran.status.code(), Some(1), "{args:?}: {ran:?}");
            assert!(
                ran.stderr.contains(&format!("no queue `{queue}`")),
                "{args:?}: {ran:?}"
            );
            assert_eq!(
                ran.stderr.trim_end().lines().count(),
                1,
                "{args:?}: {ran:?}"
            );
            assert!(
                !live.broker.queue_exists(&queue).await.expect("asked"),
                "{args:?} made `{queue}`"
            );
        }
        // The dead letter stayed where it was.
        live.wait_ready(&dead, 1).await;
        live.delete(&[&dead]).await;
        let _ = std::fs::remove_file(body);
    }

    #[tokio::test]
    async fn redrive_moves_dead_letters_back_marked_and_keeps_the_rest() {
        super::redrive_moves_dead_letters_back_marked_and_keeps_the_rest(redis().await).await;
    }

    #[tokio::test]
    async fn an_interrupted_redrive_run_again_moves_each_message_exactly_once() {
        super::an_interrupted_redrive_run_again_moves_each_message_exactly_once(redis().await)
            .await;
    }

    /// What the killed run held comes back once its lease lapses (the default 30 s, as
    /// the queues declare none), which the test waits for before it runs again.
    #[tokio::test]
    async fn a_killed_redrive_run_again_loses_nothing() {
        super::a_killed_redrive_run_again_loses_nothing(redis().await).await;
    }

    #[tokio::test]
    async fn redrive_at_a_rate_pauses_between_moves() {
        super::redrive_at_a_rate_pauses_between_moves(redis().await).await;
    }

    #[tokio::test]
    async fn redrive_refuses_a_rate_that_is_not_a_positive_number() {
        super::redrive_refuses_a_rate_that_is_not_a_positive_number(redis().await).await;
    }

    #[tokio::test]
    async fn failures_are_one_line_and_never_show_a_password() {
        super::failures_are_one_line_and_never_show_a_password(redis().await).await;
        // A login the server refuses (no such user on the test server), and a server that
        // cannot be reached (nothing listens on port 1), are named with the password
        // hidden: with a user name, and without one, as Redis before ACLs takes it.
        for (url, shown) in [
            (
                "redis://app:hunter2-secret@127.0.0.1:6379/0",
                "redis://app:***@127.0.0.1:6379/0",
            ),
            (
                "redis://app:hunter2-secret@127.0.0.1:1",
                "redis://app:***@127.0.0.1:1",
            ),
            (
                "redis://:hunter2-secret@127.0.0.1:1/0",
                "redis://:***@127.0.0.1:1/0",
            ),
        ] {
            let live = Live {
                broker: redis().await.broker,
                url,
                fifo: false,
                handed_back_in_flight: false,
            };
            let ran = live.run(&["depth", "anything"]).await;
            assert_eq!(ran.status.code(), Some(1), "{ran:?}");
            assert!(ran.stderr.contains(shown), "{ran:?}");
            assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{ran:?}");
            assert!(!ran.stderr.contains("hunter2"), "{ran:?}");
            assert!(!ran.stdout.contains("hunter2"), "{ran:?}");
        }
        // TLS is refused before anything is sent, as a command-line mistake.
        let live = Live {
            broker: redis().await.broker,
            url: "rediss://app:hunter2-secret@127.0.0.1:6379",
            fifo: false,
            handed_back_in_flight: false,
        };
        let ran = live.run(&["depth", "anything"]).await;
        assert_eq!(ran.status.code(), Some(2), "{ran:?}");
        assert!(ran.stderr.contains("TLS"), "{ran:?}");
        assert!(
            ran.stderr.contains("rediss://app:***@127.0.0.1:6379"),
            "{ran:?}"
        );
        assert_eq!(ran.stderr.trim_end().lines().count(), 1, "{ran:?}");
        assert!(!ran.stderr.contains("hunter2"), "{ran:?}");
    }
}
