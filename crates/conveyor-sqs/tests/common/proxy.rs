//! A TCP proxy between the client and the SQS emulator that tells a test when a receive is
//! under way: a `ReceiveMessage` request forwarded whole to the emulator and not answered
//! yet. A test that needs a long poll in progress waits for that instead of for the clock.

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
    accepting: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("the proxy's address");
        let (count, receiving) = watch::channel(0usize);
        let count = Arc::new(count);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(forward(client, server, count.clone()));
            }
        });
        Proxy {
            addr,
            receiving,
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// One connection: requests are forwarded as they come and parsed (HTTP/1.1, one at a
/// time, with a `content-length`); a whole `ReceiveMessage` counts as under way until the
/// emulator's first byte of answer on that connection.
async fn forward(client: TcpStream, server: TcpStream, count: Arc<watch::Sender<usize>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let pending = Arc::new(AtomicBool::new(false));
    let answered = {
        let (pending, count) = (pending.clone(), count.clone());
        move || {
            if pending.swap(false, Ordering::SeqCst) {
                count.send_modify(|n| *n -= 1);
            }
        }
    };
    let requests = {
        let (pending, count) = (pending.clone(), count.clone());
        tokio::spawn(async move {
            let mut parsed = Vec::new();
            let mut buffer = vec![0u8; 64 * 1024];
            while let Ok(read) = client_read.read(&mut buffer).await {
                if read == 0 || server_write.write_all(&buffer[..read]).await.is_err() {
                    break;
                }
                parsed.extend_from_slice(&buffer[..read]);
                while let Some((length, receive)) = whole_request(&parsed) {
                    parsed.drain(..length);
                    if receive && !pending.swap(true, Ordering::SeqCst) {
                        count.send_modify(|n| *n += 1);
                    }
                }
            }
        })
    };
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read) = server_read.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        answered();
        if client_write.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    requests.abort();
    answered();
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
