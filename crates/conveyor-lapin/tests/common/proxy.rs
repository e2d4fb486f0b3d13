//! A TCP proxy between the client and RabbitMQ that a test can make misbehave on purpose:
//! faults provoked this way happen every time, at any machine load, instead of racing the
//! clock.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Forwards every connection made to [`addr`](Self::addr) to the upstream broker.
pub struct Proxy {
    addr: SocketAddr,
    replies_stalled: watch::Sender<bool>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("the proxy's address");
        let (replies_stalled, stalled) = watch::channel(false);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(forward(client, server, stalled.clone()));
            }
        });
        Proxy {
            addr,
            replies_stalled,
            accepting,
        }
    }

    /// The URL of the broker behind this proxy.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }

    /// From now on, what the broker sends is held back (what the client sends still
    /// arrives): a confirm, a reply, a delivery never comes.
    pub fn stall_replies(&self) {
        self.replies_stalled.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn forward(client: TcpStream, server: TcpStream, mut stalled: watch::Receiver<bool>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read) = server_read.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        // Held while stalled; the bytes are never sent if the stall lasts.
        if stalled.wait_for(|stalled| !stalled).await.is_err() {
            break;
        }
        if client_write.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    requests.abort();
}
