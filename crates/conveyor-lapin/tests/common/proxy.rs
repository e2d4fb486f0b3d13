//! A TCP proxy between the client and RabbitMQ that a test can make misbehave on purpose:
//! faults provoked this way happen every time, at any machine load, instead of racing the
//! clock.
//!
//! What it can do, each at any moment and to every connection through it:
//! - hold back what the broker sends ([`stall_replies`](Proxy::stall_replies)), or what
//!   the client sends ([`stall_requests`](Proxy::stall_requests)), until
//!   [`resume`](Proxy::resume);
//! - hold back only the broker's publisher confirms
//!   ([`hold_confirms`](Proxy::hold_confirms), [`release_confirms`](Proxy::release_confirms));
//! - delay every byte, each way, by a latency ([`latency`](Proxy::latency));
//! - cut every open connection at once, both ways: with a TCP reset
//!   ([`cut_connections`](Proxy::cut_connections)), as a network failure or a killed
//!   peer does, or with a plain TCP close and no AMQP goodbye
//!   ([`close_connections`](Proxy::close_connections));
//! - refuse new connections ([`refuse_new_connections`](Proxy::refuse_new_connections)):
//!   each is reset as soon as it is accepted, before a byte is exchanged.
//!
//! It also counts the `basic.ack` and `basic.consume` frames the client sends
//! ([`acks`](Proxy::acks), [`consumes`](Proxy::consumes)), and the
//! `basic.deliver` frames the broker sends ([`deliveries`](Proxy::deliveries)).
//!
//! (`noxious`, a Rust port of Toxiproxy, was considered: it runs as a server with its own
//! control API, has not been released since 2021 and brings old versions of `tokio-util`
//! and `rand` along, and knows nothing of AMQP frames, which holding confirms needs.)

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the proxy does with what the broker sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Replies {
    /// Forwarded as it comes.
    #[default]
    Flowing,
    /// Held back, all of it.
    Stalled,
    /// Publisher confirms held back (with whatever follows them on their channel), the
    /// rest forwarded.
    ConfirmsHeld,
}

/// The faults in force, read by every connection.
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    replies: Replies,
    /// What the client sends is held back.
    requests_stalled: bool,
    /// How long each byte waits, each way, before it is passed on.
    latency: Duration,
}

/// How a connection is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// A TCP reset, each way.
    Reset,
    /// A plain TCP close (FIN), each way.
    Close,
}

/// One connection through the proxy: cut by sending on (or dropping) `cut`.
struct Link {
    cut: oneshot::Sender<Cut>,
    task: JoinHandle<()>,
}

/// What the proxy and its accepting task share.
struct Shared {
    upstream: &'static str,
    faults: watch::Sender<Faults>,
    refusing: AtomicBool,
    links: Mutex<HashMap<u64, Link>>,
    next_link: AtomicU64,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    acks: Arc<AckCounts>,
    deliveries: Arc<AtomicUsize>,
}

/// The `basic.ack` and `basic.consume` frames clients have sent through the proxy.
#[derive(Default)]
struct AckCounts {
    single: AtomicUsize,
    multiple: AtomicUsize,
    consumes: AtomicUsize,
}

/// Forwards every connection made to [`addr`](Self::addr) to the upstream broker.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            upstream,
            faults: watch::Sender::new(Faults::default()),
            refusing: false.into(),
            links: Mutex::default(),
            next_link: AtomicU64::new(0),
            accepted: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            acks: Arc::default(),
            deliveries: Arc::default(),
        });
        let accepting = tokio::spawn(accept(listener, shared.clone()));
        Proxy {
            addr,
            shared,
            accepting,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL of the broker behind this proxy.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }

    fn set(&self, change: impl FnOnce(&mut Faults)) {
        self.shared.faults.send_modify(change);
    }

    /// From now on, what the broker sends is held back (what the client sends still
    /// arrives): a confirm, a reply, a delivery never comes, until [`resume`](Self::resume).
    pub fn stall_replies(&self) {
        self.set(|faults| faults.replies = Replies::Stalled);
    }

    /// From now on, what the client sends is held back (what the broker sends still
    /// arrives): a publish, an ack, a heartbeat never reaches the broker, until
    /// [`resume`](Self::resume).
    pub fn stall_requests(&self) {
        self.set(|faults| faults.requests_stalled = true);
    }

    /// From now on, the broker's publisher confirms (`basic.ack` and `basic.nack` sent by
    /// the server) are held back, and so is everything after one on its channel, to keep
    /// that channel's order. Everything else flows: deliveries, the replies of other
    /// channels, heartbeats.
    pub fn hold_confirms(&self) {
        self.set(|faults| faults.replies = Replies::ConfirmsHeld);
    }

    /// Sends what [`hold_confirms`](Self::hold_confirms) or
    /// [`stall_replies`](Self::stall_replies) held back, in order, and lets what the
    /// broker sends flow again.
    pub fn release_confirms(&self) {
        self.set(|faults| faults.replies = Replies::Flowing);
    }

    /// Lets everything flow again, both ways: what was held back goes on, in order. The
    /// latency stays.
    pub fn resume(&self) {
        self.set(|faults| {
            faults.replies = Replies::Flowing;
            faults.requests_stalled = false;
        });
    }

    /// From now on, every byte read (each way) is passed on `latency` later; bytes keep
    /// their order. `Duration::ZERO` ends it (bytes already waiting keep their time).
    pub fn latency(&self, latency: Duration) {
        self.set(|faults| faults.latency = latency);
    }

    /// Cuts every connection open through the proxy, both ways, with a TCP reset: what
    /// either side had sent and the other had not received yet is lost. Returns once
    /// they are all closed, with how many there were. Connections made afterwards are
    /// forwarded as usual (unless refused).
    pub async fn cut_connections(&self) -> usize {
        self.cut(Cut::Reset).await
    }

    /// Closes every connection open through the proxy, both ways, as
    /// [`cut_connections`](Self::cut_connections) does, but with a plain TCP close (FIN)
    /// instead of a reset (the kernel still resets a side whose bytes the proxy had not
    /// read yet): each side sees the other end the connection without the AMQP goodbye.
    /// Returns once they are all closed, with how many there were.
    pub async fn close_connections(&self) -> usize {
        self.cut(Cut::Close).await
    }

    async fn cut(&self, how: Cut) -> usize {
        let links: Vec<Link> = {
            let mut links = self.shared.links.lock().unwrap();
            links.drain().map(|(_, link)| link).collect()
        };
        let count = links.len();
        let mut tasks = Vec::with_capacity(count);
        for Link { cut, task } in links {
            let _ = cut.send(how);
            tasks.push(task);
        }
        for task in tasks {
            let _ = task.await;
        }
        count
    }

    /// From now on, every new connection is reset as soon as it is accepted, before a
    /// byte is exchanged (connections already open are left alone).
    pub fn refuse_new_connections(&self) {
        self.shared.refusing.store(true, Ordering::SeqCst);
    }

    /// Ends [`refuse_new_connections`](Self::refuse_new_connections).
    pub fn accept_new_connections(&self) {
        self.shared.refusing.store(false, Ordering::SeqCst);
    }

    /// How many connections are open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.shared.links.lock().unwrap().len()
    }

    /// How many connections the proxy has forwarded since it started.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// The `basic.ack` frames clients have sent through the proxy since it started: how
    /// many ack one delivery, and how many ack every delivery up to theirs (`multiple`).
    pub fn acks(&self) -> (usize, usize) {
        let acks = &self.shared.acks;
        (
            acks.single.load(Ordering::SeqCst),
            acks.multiple.load(Ordering::SeqCst),
        )
    }

    /// How many `basic.consume` frames clients have sent through the proxy since it
    /// started: a consumer lapin restores with its channel counts again.
    pub fn consumes(&self) -> usize {
        self.shared.acks.consumes.load(Ordering::SeqCst)
    }

    /// How many `basic.deliver` frames the broker has sent through the proxy since it
    /// started (counted once past any latency or stall, as they are passed on or held
    /// back with a confirm).
    pub fn deliveries(&self) -> usize {
        self.shared.deliveries.load(Ordering::SeqCst)
    }

    /// How many connections the proxy has refused since it started.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    /// Stops accepting and cuts every connection (each one's cut signal is dropped).
    fn drop(&mut self) {
        self.accepting.abort();
        self.shared.links.lock().unwrap().clear();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        if shared.refusing.load(Ordering::SeqCst) {
            let _ = client.set_zero_linger();
            drop(client);
            shared.refused.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        let Ok(server) = TcpStream::connect(shared.upstream).await else {
            let _ = client.set_zero_linger();
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let id = shared.next_link.fetch_add(1, Ordering::SeqCst);
        let (cut, cut_signal) = oneshot::channel();
        // Registered before it runs, so that it can only remove itself after this.
        let mut links = shared.links.lock().unwrap();
        let task = tokio::spawn(link(
            client,
            server,
            shared.faults.subscribe(),
            cut_signal,
            shared.clone(),
            id,
        ));
        links.insert(id, Link { cut, task });
        shared.accepted.fetch_add(1, Ordering::SeqCst);
    }
}

/// Forwards one connection both ways until both sides have closed, or until it is cut.
async fn link(
    mut client: TcpStream,
    mut server: TcpStream,
    faults: watch::Receiver<Faults>,
    cut: oneshot::Receiver<Cut>,
    shared: Arc<Shared>,
    id: u64,
) {
    let cut = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let requests = pump(
            client_read,
            server_write,
            faults.clone(),
            Direction::Requests(shared.acks.clone()),
        );
        let replies = pump(
            server_read,
            client_write,
            faults,
            Direction::Replies(shared.deliveries.clone()),
        );
        tokio::select! {
            _ = async { tokio::join!(requests, replies) } => None,
            // The proxy dropped: cut too.
            how = cut => Some(how.unwrap_or(Cut::Reset)),
        }
    };
    if cut == Some(Cut::Reset) {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    drop((client, server));
    shared.links.lock().unwrap().remove(&id);
}

enum Direction {
    /// From the client to the broker, whose acks are counted.
    Requests(Arc<AckCounts>),
    /// From the broker to the client, whose deliveries are counted.
    Replies(Arc<AtomicUsize>),
}

impl Direction {
    fn stalled(&self, faults: &Faults) -> bool {
        match self {
            Direction::Requests(_) => faults.requests_stalled,
            Direction::Replies(_) => faults.replies == Replies::Stalled,
        }
    }
}

/// How many reads a direction keeps waiting (for their latency, or a stall) before it
/// stops reading, so that the sender feels the back-pressure.
const MAX_WAITING: usize = 256;

/// Passes what `from` sends on to `to`, as the faults say, until `from` closes (then
/// closes `to` after what is waiting) or either fails.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut faults: watch::Receiver<Faults>,
    direction: Direction,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut waiting: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    // Replies are cut into whole frames, so that confirms can be held; requests, so that
    // acks can be counted (after the 8-byte protocol header the client opens with).
    let mut frames = Frames::default();
    let mut header_left = PROTOCOL_HEADER;
    let mut held = Held::default();
    let mut reading = true;
    loop {
        if !reading && waiting.is_empty() {
            break;
        }
        let stalled = direction.stalled(&faults.borrow_and_update());
        let head = waiting.front().map(|(due, _)| *due);
        // Each arm reads the faults again when it acts, so that bytes read or passed on
        // after a fault was set always obey it, even if this task only runs later.
        tokio::select! {
            read = from.read(&mut buffer), if reading && waiting.len() < MAX_WAITING => {
                match read {
                    Ok(0) | Err(_) => reading = false,
                    Ok(read) => {
                        let due = Instant::now() + faults.borrow().latency;
                        waiting.push_back((due, buffer[..read].to_vec()));
                    }
                }
            }
            () = tokio::time::sleep_until(head.unwrap_or_else(Instant::now)),
                if head.is_some() && !stalled =>
            {
                let now = *faults.borrow();
                if direction.stalled(&now) {
                    continue;
                }
                let (_, bytes) = waiting.pop_front().expect("a waiting read");
                let out = match &direction {
                    Direction::Requests(acks) => {
                        let skipped = header_left.min(bytes.len());
                        header_left -= skipped;
                        frames.push(&bytes[skipped..]);
                        while let Some(frame) = frames.next_frame() {
                            acks.count(&frame);
                        }
                        bytes
                    }
                    Direction::Replies(deliveries) => {
                        let holding = now.replies == Replies::ConfirmsHeld;
                        frames.push(&bytes);
                        let mut out = if holding { Vec::new() } else { held.release() };
                        while let Some(frame) = frames.next_frame() {
                            if is_method(&frame, BASIC_DELIVER) {
                                deliveries.fetch_add(1, Ordering::SeqCst);
                            }
                            if !(holding && held.keeps(&frame)) {
                                out.extend_from_slice(&frame);
                            }
                        }
                        out
                    }
                };
                if !send(&mut to, &out).await {
                    return;
                }
            }
            changed = faults.changed() => {
                if changed.is_err() {
                    return;
                }
                let released = matches!(direction, Direction::Replies(_))
                    && faults.borrow().replies == Replies::Flowing;
                if released && !send(&mut to, &held.release()).await {
                    return;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

async fn send(to: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> bool {
    bytes.is_empty() || to.write_all(bytes).await.is_ok()
}

/// AMQP 0-9-1 frames: a 7-byte header (type, channel, payload size), the payload, and
/// the frame-end octet.
const FRAME_HEADER: usize = 7;
const METHOD_FRAME: u8 = 1;
const BASIC_CLASS: u16 = 60;
const BASIC_CONSUME: u16 = 20;
const BASIC_DELIVER: u16 = 60;
const BASIC_ACK: u16 = 80;
const BASIC_NACK: u16 = 120;
/// `AMQP\x00\x00\x09\x01`, which the client sends before its first frame.
const PROTOCOL_HEADER: usize = 8;

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
    is_method(frame, BASIC_ACK) || is_method(frame, BASIC_NACK)
}

fn is_method(frame: &[u8], method: u16) -> bool {
    frame[0] == METHOD_FRAME
        && frame.len() >= FRAME_HEADER + 4
        && u16::from_be_bytes([frame[7], frame[8]]) == BASIC_CLASS
        && u16::from_be_bytes([frame[9], frame[10]]) == method
}

impl AckCounts {
    /// Counts `frame`, sent by the client, if it is a `basic.consume`, or a `basic.ack`:
    /// class and method, the delivery tag (8 bytes), then the `multiple` bit.
    fn count(&self, frame: &[u8]) {
        if is_method(frame, BASIC_CONSUME) {
            self.consumes.fetch_add(1, Ordering::SeqCst);
        }
        if !is_method(frame, BASIC_ACK) {
            return;
        }
        let multiple = frame
            .get(FRAME_HEADER + 12)
            .is_some_and(|bits| bits & 1 == 1);
        let counter = if multiple {
            &self.multiple
        } else {
            &self.single
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
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
