//! A TCP proxy between the client and RabbitMQ that a test can make misbehave on purpose:
//! faults provoked this way happen every time, at any machine load, instead of racing the
//! clock.

use std::collections::HashSet;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with what the broker sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replies {
    /// Forwarded as it comes.
    Flowing,
    /// Held back, all of it.
    Stalled,
    /// Publisher confirms held back (with whatever follows them on their channel), the
    /// rest forwarded.
    ConfirmsHeld,
}

/// Forwards every connection made to [`addr`](Self::addr) to the upstream broker.
pub struct Proxy {
    addr: SocketAddr,
    replies: watch::Sender<Replies>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("the proxy's address");
        let (replies, mode) = watch::channel(Replies::Flowing);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(forward(client, server, mode.clone()));
            }
        });
        Proxy {
            addr,
            replies,
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
        self.replies.send_replace(Replies::Stalled);
    }

    /// From now on, the broker's publisher confirms (`basic.ack` and `basic.nack` sent by
    /// the server) are held back, and so is everything after one on its channel, to keep
    /// that channel's order. Everything else flows: deliveries, the replies of other
    /// channels, heartbeats.
    pub fn hold_confirms(&self) {
        self.replies.send_replace(Replies::ConfirmsHeld);
    }

    /// Sends what [`hold_confirms`](Self::hold_confirms) held back, in order, and lets
    /// everything flow again.
    pub fn release_confirms(&self) {
        self.replies.send_replace(Replies::Flowing);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// AMQP 0-9-1 frames: a 7-byte header (type, channel, payload size), the payload, and
/// the frame-end octet.
const FRAME_HEADER: usize = 7;
const METHOD_FRAME: u8 = 1;
const BASIC_CLASS: u16 = 60;
const BASIC_ACK: u16 = 80;
const BASIC_NACK: u16 = 120;

/// The broker's bytes, cut into whole frames.
#[derive(Default)]
struct Frames {
    partial: Vec<u8>,
}

impl Frames {
    fn push(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    fn next_frame(&mut self) -> Option<Vec<u8>> {
        let header = self.partial.get(..FRAME_HEADER)?;
        let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
        let length = FRAME_HEADER + size + 1;
        if self.partial.len() < length {
            return None;
        }
        Some(self.partial.drain(..length).collect())
    }
}

fn channel_of(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[1], frame[2]])
}

/// Whether `frame`, sent by the broker, is a publisher confirm.
fn is_confirm(frame: &[u8]) -> bool {
    frame[0] == METHOD_FRAME
        && frame.len() >= FRAME_HEADER + 4
        && u16::from_be_bytes([frame[7], frame[8]]) == BASIC_CLASS
        && matches!(
            u16::from_be_bytes([frame[9], frame[10]]),
            BASIC_ACK | BASIC_NACK
        )
}

/// The frames [`Replies::ConfirmsHeld`] keeps back, in order.
#[derive(Default)]
struct Held {
    channels: HashSet<u16>,
    frames: Vec<u8>,
}

impl Held {
    /// Keeps `frame` back if it is a confirm or follows one on its channel.
    fn keeps(&mut self, frame: &[u8]) -> bool {
        let channel = channel_of(frame);
        if is_confirm(frame) || self.channels.contains(&channel) {
            self.channels.insert(channel);
            self.frames.extend_from_slice(frame);
            return true;
        }
        false
    }

    fn release(&mut self) -> Vec<u8> {
        self.channels.clear();
        std::mem::take(&mut self.frames)
    }
}

async fn forward(client: TcpStream, server: TcpStream, mut mode: watch::Receiver<Replies>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    let mut frames = Frames::default();
    let mut held = Held::default();
    loop {
        tokio::select! {
            read = server_read.read(&mut buffer) => {
                let Ok(read) = read else { break };
                if read == 0 {
                    break;
                }
                // Held while stalled; the bytes are never sent if the stall lasts.
                let holding = match mode.wait_for(|mode| *mode != Replies::Stalled).await {
                    Ok(now) => *now == Replies::ConfirmsHeld,
                    Err(_) => break,
                };
                frames.push(&buffer[..read]);
                let mut out = if holding { Vec::new() } else { held.release() };
                while let Some(frame) = frames.next_frame() {
                    if !(holding && held.keeps(&frame)) {
                        out.extend_from_slice(&frame);
                    }
                }
                if !send(&mut client_write, &out).await {
                    break;
                }
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    break;
                }
                let released = *mode.borrow_and_update() == Replies::Flowing;
                if released && !send(&mut client_write, &held.release()).await {
                    break;
                }
            }
        }
    }
    requests.abort();
}

async fn send(client: &mut OwnedWriteHalf, bytes: &[u8]) -> bool {
    bytes.is_empty() || client.write_all(bytes).await.is_ok()
}
