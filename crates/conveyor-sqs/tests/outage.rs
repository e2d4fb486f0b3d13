//! The emulator stops answering for 10 s in the middle of a run: the pump backs off,
//! resumes by itself, and no message is lost.
//!
//! This test starts its own moto server (on a free port) so that stopping it disturbs no
//! other test; python3 must have moto (`scripts/services/sqs.sh` installs it).

mod common;

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{declare, eventually, unique};
use conveyor::{App, Broker, Json, Message, Publisher, QueueSpec, State};

/// A moto server of this test's own, killed when dropped.
struct Emulator {
    child: Child,
    endpoint: String,
}

impl Emulator {
    fn start() -> Emulator {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 with moto (scripts/services/sqs.sh installs it)");
        Emulator {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} failed");
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn slowly(Json(n): Json<u64>, State(seen): State<Arc<Mutex<Vec<u64>>>>) {
    tokio::time::sleep(Duration::from_millis(50)).await;
    seen.lock().unwrap().push(n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pump_backs_off_while_the_emulator_is_stopped_and_resumes_without_loss() {
    let emulator = Emulator::start();
    // Calls give up after 2 s beyond the poll, so the outage shows as failed receives.
    let broker = conveyor_sqs::SqsBroker::builder()
        .endpoint(&emulator.endpoint)
        .region("us-east-1")
        .static_credentials("test", "test")
        .wait_time(Duration::from_secs(1))
        .visibility_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let name = unique("outage", false);
    eventually(
        "the emulator to answer",
        Duration::from_secs(20),
        || async {
            broker
                .declare_queue(&QueueSpec::new(name.clone()))
                .await
                .is_ok()
        },
    )
    .await;
    let queue = declare(&broker, QueueSpec::new(name)).await;
    let messages: Vec<Message> = (0..60u64).map(|n| Message::json(&n).unwrap()).collect();
    broker.publish_batch(&queue, messages).await.unwrap();

    let seen = Arc::new(Mutex::new(Vec::new()));
    let running = App::new("outage")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), slowly, |m| m.workers(2))
        .start()
        .await
        .unwrap();
    eventually(
        "some messages before the outage",
        Duration::from_secs(20),
        || async { seen.lock().unwrap().len() >= 10 },
    )
    .await;

    emulator.signal("-STOP");
    // The scenario itself: the emulator is gone for 10 s.
    tokio::time::sleep(Duration::from_secs(10)).await;
    emulator.signal("-CONT");

    eventually(
        "every message after the outage",
        Duration::from_secs(90),
        || async { seen.lock().unwrap().iter().collect::<HashSet<_>>().len() == 60 },
    )
    .await;
    running.shutdown().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let unique: HashSet<u64> = seen.iter().copied().collect();
    assert_eq!(unique, (0..60).collect::<HashSet<u64>>(), "no message lost");
}
