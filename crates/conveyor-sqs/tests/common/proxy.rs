//! A TCP proxy between the client and the SQS emulator that tells a test when a receive is
//! under way: a `ReceiveMessage` request forwarded whole to the emulator and not answered
//! yet. A test that needs a long poll in progress waits for that instead of for the clock.
//!
//! It also stalls on demand: while stalled, nothing is forwarded either way (connections
//! stay open and new ones are accepted, but requests and answers are held), as when the
//! broker or the network stops answering; once it resumes, what was held goes on.
//!
//! It also counts how receives ended: answered by the emulator, or given up by the client
//! (which closed its side of the connection while the receive was under way).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Forwards every connection made to [`endpoint`](Self::endpoint) to the emulator.
pub struct Proxy {
    addr: SocketAddr,
    /// How many receives are under way at the emulator.
    receiving: watch::Receiver<usize>,
    /// How many receives ended, and how.
    ended: watch::Receiver<Ended>,
    /// Whether traffic is held.
    stalled: watch::Sender<bool>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("the proxy's address");
        let (count, receiving) = watch::channel(0usize);
        let count = Arc::new(count);
        let (ends, ended) = watch::channel(Ended::default());
        let ends = Arc::new(ends);
        let (stalled, held) = watch::channel(false);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let receives = Receives {
                    under_way: count.clone(),
                    ended: ends.clone(),
                };
                tokio::spawn(forward(client, server, receives, held.clone()));
            }
        });
        Proxy {
            addr,
            receiving,
            ended,
            stalled,
            accepting,
        }
    }

    /// The endpoint URL to give the broker.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Resolves once a `ReceiveMessage` has reached the emulator whole and is not answered.
    pub async fn receive_under_way(&self) {
        self.receiving
            .clone()
            .wait_for(|n| *n > 0)
            .await
            .expect("the proxy runs");
    }

    /// Resolves with the counts once a receive has ended, either way.
    pub async fn receive_ended(&self) -> Ended {
        *self
            .ended
            .clone()
            .wait_for(|ended| ended.answered + ended.given_up + ended.closed > 0)
            .await
            .expect("the proxy runs")
    }
}

/// How the receives that ended did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ended {
    /// The emulator's answer reached the client.
    pub answered: usize,
    /// The client closed the connection first.
    pub given_up: usize,
    /// The emulator closed the connection without answering.
    pub closed: usize,
}

/// Where one connection reports its receive.
#[derive(Clone)]
struct Receives {
    under_way: Arc<watch::Sender<usize>>,
    ended: Arc<watch::Sender<Ended>>,
}

impl Proxy {
    /// Holds every request and answer from now on, on every connection, new ones included;
    /// closes nothing.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Forwards again, starting with what was held.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Resolves once traffic is not held (at once if it is not).
async fn flowing(held: &mut watch::Receiver<bool>) {
    // An error means the proxy is gone; its connections then just drain.
    let _ = held.wait_for(|stalled| !*stalled).await;
}

/// One connection: requests are forwarded as they come and parsed (HTTP/1.1, one at a
/// time, with a `content-length`); a whole `ReceiveMessage` counts as under way until the
/// emulator's first byte of answer on that connection reaches the client (answered), or
/// the client closes the connection (given up). While the proxy is stalled, what is read
/// either way is held, not forwarded.
async fn forward(
    client: TcpStream,
    server: TcpStream,
    receives: Receives,
    held: watch::Receiver<bool>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let pending = Arc::new(AtomicBool::new(false));
    // Ends the receive under way, if one is, as `how` says.
    let end = {
        let (pending, receives) = (pending.clone(), receives.clone());
        move |how: fn(&mut Ended)| {
            if pending.swap(false, Ordering::SeqCst) {
                receives.under_way.send_modify(|n| *n -= 1);
                receives.ended.send_modify(how);
            }
        }
    };
    let requests = {
        let (pending, receives, mut held) = (pending.clone(), receives.clone(), held.clone());
        let end = end.clone();
        tokio::spawn(async move {
            let mut parsed = Vec::new();
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let read = client_read.read(&mut buffer).await.unwrap_or(0);
                if read == 0 {
                    // The client closed its side: a receive it was waiting on is given up,
                    // whatever the emulator answers later.
                    end(|ended| ended.given_up += 1);
                }
                // Even the end of the request stream waits: a stalled link passes nothing.
                flowing(&mut held).await;
                if read == 0 || server_write.write_all(&buffer[..read]).await.is_err() {
                    break;
                }
                parsed.extend_from_slice(&buffer[..read]);
                while let Some((length, receive)) = whole_request(&parsed) {
                    parsed.drain(..length);
                    if receive && !pending.swap(true, Ordering::SeqCst) {
                        receives.under_way.send_modify(|n| *n += 1);
                    }
                }
            }
        })
    };
    let mut held = held;
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read) = server_read.read(&mut buffer).await {
        flowing(&mut held).await;
        if read == 0 {
            break;
        }
        end(|ended| ended.answered += 1);
        if client_write.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    requests.abort();
    end(|ended| ended.closed += 1);
}

/// The length of the first request in `bytes` once it is whole, and whether it is a
/// `ReceiveMessage`.
fn whole_request(bytes: &[u8]) -> Option<(usize, bool)> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    let body = header("content-length:").map_or(0, |n| n.parse().unwrap_or(0));
    let receive = header("x-amz-target:") == Some("amazonsqs.receivemessage");
    (bytes.len() >= end + body).then_some((end + body, receive))
}
