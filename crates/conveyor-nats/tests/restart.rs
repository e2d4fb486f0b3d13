//! A NATS server killed and started again under load loses nothing: messages published
//! before, during and after the outage are all handled. The test runs a server of its
//! own (the one `scripts/services/nats.sh` starts is shared), on a free port with its
//! store in a directory of its own, and kills it with SIGKILL.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{App, Broker, Json, Message, Publisher, QueueSpec, State};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

const DEADLINE: Duration = Duration::from_secs(60);

/// A nats-server of the test's own.
struct Server {
    port: u16,
    store: PathBuf,
    child: Child,
}

impl Server {
    async fn start(port: u16, store: &Path) -> Server {
        let binary = ["/usr/sbin/nats-server", "nats-server"]
            .into_iter()
            .find(|b| !b.starts_with('/') || Path::new(b).exists())
            .expect("a nats-server binary");
        let child = Command::new(binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store)
            .kill_on_drop(true)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server starts");
        let server = Server {
            port,
            store: store.to_path_buf(),
            child,
        };
        server.wait_until_serving().await;
        server
    }

    /// Waits until the server greets a client with JetStream on.
    async fn wait_until_serving(&self) {
        let address = format!("127.0.0.1:{}", self.port);
        let serving = tokio::time::timeout(DEADLINE, async {
            loop {
                if let Ok(mut stream) = tokio::net::TcpStream::connect(&address).await {
                    let mut greeting = vec![0; 4096];
                    if let Ok(read) = stream.read(&mut greeting).await
                        && String::from_utf8_lossy(&greeting[..read]).contains("\"jetstream\":true")
                    {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(serving.is_ok(), "the test's nats-server did not start");
    }

    async fn kill(mut self) -> (u16, PathBuf) {
        self.child.kill().await.expect("killed");
        (self.port, self.store)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

async fn handle(Json(id): Json<u64>, State(seen): State<Arc<Mutex<BTreeSet<u64>>>>) {
    tokio::time::sleep(Duration::from_millis(1)).await;
    if let Ok(mut seen) = seen.lock() {
        seen.insert(id);
    }
}

fn count(seen: &Mutex<BTreeSet<u64>>) -> usize {
    seen.lock().map(|s| s.len()).unwrap_or(0)
}

/// Publishes `ids`, each until JetStream acknowledges it: an id that failed (the server
/// was down) is sent again, and the message id deduplicates one stored twice.
async fn publish_all(broker: conveyor_nats::NatsBroker, queue: String, ids: std::ops::Range<u64>) {
    for id in ids {
        let message = Message::builder()
            .message_id(format!("job-{id}"))
            .json(&id)
            .expect("encoded");
        let sent = tokio::time::timeout(DEADLINE, async {
            while broker.publish(&queue, message.clone()).await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(sent.is_ok(), "job {id} was never stored");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_restarted_under_load_loses_no_message() {
    const BEFORE: u64 = 1000;
    const DURING: u64 = 1000;
    let store = std::env::temp_dir().join(common::unique("conveyor-nats-restart"));
    let server = Server::start(free_port(), &store).await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    // Acks lost with the server come back after this ack wait.
    let broker = common::broker_at(&url, Duration::from_secs(3)).await;
    let queue = common::unique("restart");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .expect("declared");
    publish_all(broker.clone(), queue.clone(), 0..BEFORE).await;
    let seen: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let app = App::new("restart")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), handle, |m| m.workers(4))
        .start()
        .await
        .expect("started");
    let publishing = tokio::spawn(publish_all(
        broker.clone(),
        queue.clone(),
        BEFORE..BEFORE + DURING,
    ));
    let handled_some = tokio::time::timeout(DEADLINE, async {
        while count(&seen) < 200 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(handled_some.is_ok(), "200 messages handled before the kill");
    let (port, store) = server.kill().await;
    let server = Server::start(port, &store).await;
    publishing.await.expect("every message published");
    let all = (BEFORE + DURING) as usize;
    let handled_all = tokio::time::timeout(DEADLINE, async {
        while count(&seen) < all {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        handled_all.is_ok(),
        "{} of {all} messages handled after the restart",
        count(&seen)
    );
    app.shutdown().await.expect("shut down");
    let depth = broker.queue_depth(&queue).await.expect("depth");
    assert_eq!(depth.ready, 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&store);
}
