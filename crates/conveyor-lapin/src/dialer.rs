//! Opening the TCP (or TLS) streams of the broker's connection: the first connect's
//! attempts, bounded by its timeout, then the reconnects after a loss, for as long as
//! it takes.
//!
//! lapin runs a connection on a thread of its own (`lapin-io-loop`), which opens each
//! stream through a closure (this dialer) and, with auto-recovery, retries that closure
//! and the handshake after it with the backoff of the connection's properties, for the
//! first connect as for a reconnect. That thread ends only when the connection closes
//! or the backoff runs out: with an unbounded backoff, a first connect that failed (or
//! timed out) left it dialing the broker for ever. So lapin's own backoff is bounded
//! and has no delay ([`LAPIN_RETRIES`]), and the dialer paces the attempts itself: it
//! never fails while it is to keep trying, and once it gives up it fails at once, so
//! lapin's thread runs out of retries and ends within moments.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use conveyor::kit::RetryPause;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many times lapin retries the dialer, and runs another handshake after a failed
/// one, before it gives the connection up. The dialer does not fail while it is to keep
/// trying, so this bounds how long lapin's thread lives on once the dialer has given up
/// (a retry is a zero-length sleep, about a millisecond on tokio's timer wheel), and how
/// many reconnect handshakes may fail in a row (a server that accepts the TCP connection
/// then drops it, say) before recovery gives up: each is paced by the dialer's backoff,
/// so that takes hours.
pub(crate) const LAPIN_RETRIES: usize = 500;

/// How long one reconnect attempt may take to open its stream, so that an attempt the
/// network swallows (no answer at all) is given up for a new one.
const RECONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// What a first connect that did not succeed ran into last: the cause its error names.
#[derive(Debug)]
pub(crate) enum Failure {
    /// An attempt failed: refused, unreachable, a TLS handshake, the server closing the
    /// connection during the AMQP handshake, ...
    Failed(io::Error),
    /// An attempt was still waiting when the time was up.
    TimedOut(Stage),
}

/// Where a first connect was waiting when its time was up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// For the TCP (or TLS) connection to be accepted.
    Connection,
    /// For the broker's answer to the AMQP handshake, on an accepted connection.
    Handshake,
}

impl Stage {
    /// What the first connect was waiting for, as [`LapinError::ConnectTimeout`] says it.
    ///
    /// [`LapinError::ConnectTimeout`]: crate::LapinError::ConnectTimeout
    pub(crate) fn waiting_for(self) -> &'static str {
        match self {
            Stage::Connection => "the connection to be accepted (TCP, and TLS for amqps://)",
            Stage::Handshake => "an answer to the AMQP handshake on an accepted connection",
        }
    }
}

/// The streams of one connection, and how the first connect is going.
pub(crate) struct Dialer {
    /// The broker's URL, password redacted, for the logs.
    url: String,
    /// How long a reconnect's AMQP handshake may wait for the broker once its stream is
    /// open, before the dialer cuts it and tries again. A load balancer whose brokers are
    /// down, or a proxy, may accept the TCP connection and never answer; lapin would
    /// wait on it for ever.
    handshake_timeout: Duration,
    /// Whether the connection is up, as lapin's own status says the moment a handshake
    /// ends; set once the first connect has succeeded. The broker's events task reports
    /// the same only later ([`Dialer::connected`]), and may lag: a reconnect's watchdog,
    /// and that late report, look here to tell whether the latest handshake ended.
    up: OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
    state: Mutex<State>,
    /// Wakes a dialer waiting between two attempts when it is to give up.
    wake: Notify,
    /// Wakes [`Dialer::stopped`] when lapin's thread has ended.
    stopping: Notify,
}

struct State {
    phase: Phase,
    attempt: Attempt,
    /// Failed attempts in a row: the backoff's exponent.
    failures: u32,
    /// What the first connect's last attempt ran into.
    last_failure: Option<Failure>,
    /// Whether the dialer failed a call of lapin's because it gave up.
    refused: bool,
    /// Whether lapin has dropped the dialer's handle: its thread has ended.
    released: bool,
    /// A stream was handed to lapin after the first connect: what connects next is a
    /// recovery.
    recovering: bool,
    /// Streams handed to lapin so far: tells a handshake's watchdog whether the one it
    /// watches is still the one under way.
    handshakes: u64,
}

enum Phase {
    /// The first connect, until `deadline`.
    First { deadline: Instant },
    /// Connected once: every attempt is a reconnect, and there is no deadline.
    Connected,
    /// The first connect failed: no more attempts.
    GivenUp,
}

enum Attempt {
    /// Between attempts (or none yet).
    Idle,
    /// Opening a stream.
    Dialing,
    /// A stream was handed to lapin, which runs the AMQP handshake on it, with a
    /// duplicate of its socket, to shut it down should the handshake not end in time
    /// (lapin's thread would otherwise wait on it for ever): at the first connect's
    /// deadline, or the handshake timeout after a reconnect's stream opened.
    Handshaking(Option<std::net::TcpStream>),
}

impl Dialer {
    /// A dialer for the broker at `url` (password redacted), whose first connect may try
    /// until `deadline`, and whose reconnects' handshakes may take `handshake_timeout`.
    pub(crate) fn new(url: String, deadline: Instant, handshake_timeout: Duration) -> Self {
        Dialer {
            url,
            handshake_timeout,
            up: OnceLock::new(),
            state: Mutex::new(State {
                phase: Phase::First { deadline },
                attempt: Attempt::Idle,
                failures: 0,
                last_failure: None,
                refused: false,
                released: false,
                recovering: false,
                handshakes: 0,
            }),
            wake: Notify::new(),
            stopping: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        conveyor::kit::lock(&self.state)
    }

    /// Follows the connection's status through `up` (lapin's `status().connected()`),
    /// from its first connect on. Only the first call counts.
    pub(crate) fn follow(&self, up: impl Fn() -> bool + Send + Sync + 'static) {
        let _ = self.up.set(Box::new(up));
    }

    /// Whether the connection is up; `None` while the dialer follows no status.
    fn connection_up(&self) -> Option<bool> {
        self.up.get().map(|up| up())
    }

    /// Waits until the next attempt is due, and returns how long it may take; or fails
    /// at once once the dialer has given up (or its first connect's time is up), which
    /// lapin's thread takes as a failed attempt, until its retries run out.
    pub(crate) async fn next_attempt(&self) -> Result<Duration, lapin::Error> {
        let due = {
            let mut state = self.state();
            // lapin asks again after a stream was handed over: the handshake on it failed
            // (the connection was closed or reset before it ended).
            if let Attempt::Handshaking(_) = std::mem::replace(&mut state.attempt, Attempt::Idle) {
                state.failures = state.failures.saturating_add(1);
                if let Phase::First { .. } = state.phase {
                    state.last_failure = Some(Failure::Failed(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the connection was closed during the AMQP handshake",
                    )));
                }
            }
            let now = Instant::now();
            match state.phase {
                Phase::GivenUp => return Err(self.refuse(&mut state)),
                Phase::First { deadline } if now >= deadline => return Err(self.refuse(&mut state)),
                // The first attempt of a first connect goes at once.
                Phase::First { .. } if state.failures == 0 => now,
                Phase::First { deadline } => (now + backoff(state.failures)).min(deadline),
                // After a loss, a short pause first: the broker may be restarting.
                Phase::Connected => now + backoff(state.failures),
            }
        };
        loop {
            // Woken early (by `give_up`, or a stale wake-up): look at the phase again.
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = self.wake.notified() => {}
            }
            let mut state = self.state();
            let now = Instant::now();
            match state.phase {
                Phase::GivenUp => return Err(self.refuse(&mut state)),
                Phase::First { deadline } if now >= deadline => return Err(self.refuse(&mut state)),
                _ if now < due => continue,
                Phase::First { deadline } => {
                    state.attempt = Attempt::Dialing;
                    return Ok(deadline - now);
                }
                Phase::Connected => {
                    state.attempt = Attempt::Dialing;
                    return Ok(RECONNECT_ATTEMPT_TIMEOUT);
                }
            }
        }
    }

    /// The error lapin gets from a dialer that no longer tries.
    fn refuse(&self, state: &mut State) -> lapin::Error {
        state.attempt = Attempt::Idle;
        state.refused = true;
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "gave up connecting to RabbitMQ",
        )
        .into()
    }

    /// Waits until lapin's thread has ended (it drops its [`Handle`] on the dialer as
    /// it ends, having run out of retries or stopped by itself).
    pub(crate) async fn stopped(&self) {
        conveyor::kit::wait_for(&self.stopping, || self.state().released.then_some(())).await;
    }

    /// The attempt opened a stream whose socket is `socket`, to hand to lapin. Returns
    /// false if the dialer gave up meanwhile: the stream is then to be dropped, since no
    /// one would cut a handshake on it.
    ///
    /// A reconnect's handshake is cut if it has not ended within the handshake timeout;
    /// lapin then counts it as failed and asks for another attempt.
    pub(crate) fn opened(self: &Arc<Self>, socket: Option<&tokio::net::TcpStream>) -> bool {
        let mut state = self.state();
        let reconnect = match state.phase {
            Phase::First { .. } => false,
            Phase::Connected => {
                state.recovering = true;
                true
            }
            Phase::GivenUp => return false,
        };
        let spare = socket.and_then(duplicate);
        state.handshakes = state.handshakes.wrapping_add(1);
        if reconnect && spare.is_some() {
            // Called on lapin's thread, inside the runtime the connection runs on.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(cut_if_stalled(
                    Arc::downgrade(self),
                    state.handshakes,
                    self.handshake_timeout,
                ));
            }
        }
        state.attempt = Attempt::Handshaking(spare);
        true
    }

    /// The attempt failed with `error`; if `fatal` (a TLS failure: trying again would
    /// not help), a first connect ends there.
    pub(crate) fn failed(&self, error: io::Error, fatal: bool) {
        let mut state = self.state();
        state.attempt = Attempt::Idle;
        state.failures = state.failures.saturating_add(1);
        match state.phase {
            Phase::First { .. } => {
                // Said once, so that a service waiting for its broker tells why.
                if state.last_failure.is_none() {
                    tracing::warn!(url = %self.url, error = %conveyor::Report(&error), "cannot reach RabbitMQ yet; retrying");
                }
                state.last_failure = Some(Failure::Failed(error));
                if fatal {
                    state.phase = Phase::GivenUp;
                }
            }
            Phase::Connected => {
                tracing::debug!(url = %self.url, error = %conveyor::Report(&error), "cannot reach RabbitMQ yet; retrying");
            }
            Phase::GivenUp => {}
        }
    }

    /// The attempt got no connection within the time it had.
    pub(crate) fn timed_out(&self) {
        let mut state = self.state();
        state.attempt = Attempt::Idle;
        state.failures = state.failures.saturating_add(1);
        if let Phase::First { .. } = state.phase {
            state.last_failure = Some(Failure::TimedOut(Stage::Connection));
        }
    }

    /// A connection was established (the first, or a recovered one): later attempts are
    /// reconnects, paced from the shortest delay again. Returns whether it was a
    /// recovery (lapin may or may not report the first connect twice).
    ///
    /// The report may come late: after the connection was lost again, and even after
    /// the next reconnect's stream was handed over, whose watchdog must stay armed. So the
    /// attempt is left as it is unless the connection is up now. (A recovery reported
    /// that late and the next one then count as one.)
    pub(crate) fn connected(&self) -> bool {
        // lapin's status is read before the dialer's lock is taken, never under it.
        let latest_ended = self.connection_up().unwrap_or(true);
        let mut state = self.state();
        let recovered = std::mem::take(&mut state.recovering);
        if !matches!(state.phase, Phase::GivenUp) {
            state.phase = Phase::Connected;
        }
        state.failures = 0;
        if latest_ended {
            // Drops the handshake's duplicate socket (the connection keeps its own).
            state.attempt = Attempt::Idle;
        }
        state.last_failure = None;
        recovered
    }

    /// The first connect failed: no more attempts. A handshake still waiting for the
    /// broker is cut (its socket shut down), so that lapin's thread stops waiting on it.
    /// Returns what the first connect ran into last, and whether lapin's error (if it
    /// returned one) is only the dialer refusing to go on.
    pub(crate) fn give_up(&self) -> (Option<Failure>, bool) {
        let mut state = self.state();
        state.phase = Phase::GivenUp;
        let waiting = match std::mem::replace(&mut state.attempt, Attempt::Idle) {
            Attempt::Idle => None,
            Attempt::Dialing => Some(Stage::Connection),
            Attempt::Handshaking(spare) => {
                if let Some(socket) = spare {
                    // Already closed, if the handshake failed: nothing to do then.
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
                Some(Stage::Handshake)
            }
        };
        // One waiter at most (lapin's thread), and a stored wake-up is harmless.
        self.wake.notify_one();
        let failure = match waiting {
            Some(stage) => Some(Failure::TimedOut(stage)),
            None => state.last_failure.take(),
        };
        (failure, state.refused)
    }
}

/// Shuts down the socket of reconnect handshake `number` if it is still under way
/// `timeout` from now: lapin's handshake on it then fails.
async fn cut_if_stalled(dialer: Weak<Dialer>, number: u64, timeout: Duration) {
    tokio::time::sleep(timeout).await;
    let Some(dialer) = dialer.upgrade() else {
        return;
    };
    // Up, with no later stream handed over: this handshake ended, whether or not the
    // events task has reported it yet.
    if dialer.connection_up() == Some(true) {
        return;
    }
    let state = dialer.state();
    if state.handshakes != number {
        return;
    }
    if let Attempt::Handshaking(Some(socket)) = &state.attempt {
        tracing::debug!(
            url = %dialer.url,
            ?timeout,
            "RabbitMQ did not finish the reconnect's handshake in time; trying again"
        );
        // Already closed, if the handshake just failed: nothing to do then.
        let _ = socket.shutdown(std::net::Shutdown::Both);
    }
}

/// The delay before the attempt after `failures` failed ones: the kit's retry pause
/// (from 100 ms, doubling up to 30 s), plus up to as much again at random
/// ([`conveyor::kit::jittered`]).
fn backoff(failures: u32) -> Duration {
    conveyor::kit::jittered(RetryPause::after(failures.saturating_add(1)))
}

/// A second handle on `socket` (a duplicated descriptor), which can shut the socket
/// down while lapin owns the first.
fn duplicate(socket: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        socket
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .map(std::net::TcpStream::from)
    }
    #[cfg(windows)]
    {
        use std::os::windows::io::AsSocket;
        socket
            .as_socket()
            .try_clone_to_owned()
            .ok()
            .map(std::net::TcpStream::from)
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = socket;
        None
    }
}

/// lapin's handle on the dialer, which the dial closure lapin keeps for the life of its
/// thread owns: dropped when the thread ends, it tells [`Dialer::stopped`].
pub(crate) struct Handle(pub(crate) Arc<Dialer>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.state().released = true;
        self.0.stopping.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reconnect handshake timeout of the dialers tested here.
    const HANDSHAKE: Duration = Duration::from_secs(10);

    #[test]
    fn the_backoff_doubles_up_to_its_ceiling_with_jitter() {
        for failures in [0, 1, 5, 20, 40, u32::MAX] {
            let base = RetryPause::MIN
                .saturating_mul(1u32.checked_shl(failures).unwrap_or(u32::MAX))
                .min(RetryPause::MAX);
            let delay = backoff(failures);
            assert!(delay >= base && delay <= base * 2, "{failures}: {delay:?}");
        }
        assert!(backoff(40) >= RetryPause::MAX);
    }

    #[tokio::test]
    async fn a_dialer_that_gave_up_fails_at_once_and_names_the_last_failure() {
        let dialer = Dialer::new(
            String::new(),
            Instant::now() + Duration::from_secs(60),
            HANDSHAKE,
        );
        assert!(dialer.next_attempt().await.is_ok());
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        dialer.failed(refused, false);
        let (failure, refused_lapin) = dialer.give_up();
        assert!(
            matches!(&failure, Some(Failure::Failed(e)) if e.kind() == io::ErrorKind::ConnectionRefused),
            "{failure:?}"
        );
        assert!(!refused_lapin);
        assert!(dialer.next_attempt().await.is_err());
        assert!(dialer.give_up().1, "lapin was refused");
    }

    #[tokio::test(start_paused = true)]
    async fn giving_up_wakes_a_dialer_waiting_for_its_next_attempt() {
        let dialer = Arc::new(Dialer::new(
            String::new(),
            Instant::now() + Duration::from_secs(600),
            HANDSHAKE,
        ));
        assert!(dialer.next_attempt().await.is_ok());
        dialer.timed_out();
        let waiting = tokio::spawn({
            let dialer = dialer.clone();
            async move { dialer.next_attempt().await.is_err() }
        });
        tokio::task::yield_now().await;
        let (failure, _) = dialer.give_up();
        assert!(
            matches!(failure, Some(Failure::TimedOut(Stage::Connection))),
            "{failure:?}"
        );
        assert!(waiting.await.unwrap());
    }

    /// A stream to a listener that accepts and never answers: a handshake on it waits.
    async fn silent_stream() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// Reads `stream` until it ends; true if it ended (or failed), false if it was still
    /// open when `within` had passed.
    async fn ends_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(within, stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// lapin's status of a connection, as a test sets it.
    type Up = Arc<std::sync::atomic::AtomicBool>;

    fn set(up: &Up, value: bool) {
        up.store(value, std::sync::atomic::Ordering::SeqCst);
    }

    /// A dialer connected once, whose reconnect just handed lapin a stream to a silent
    /// broker: that stream, the broker's end of it, and the connection's status (down).
    async fn reconnect_handed_over() -> (
        Arc<Dialer>,
        Up,
        tokio::net::TcpStream,
        tokio::net::TcpStream,
    ) {
        let dialer = Arc::new(Dialer::new(
            String::new(),
            Instant::now() + Duration::from_secs(60),
            HANDSHAKE,
        ));
        let up = Up::default();
        dialer.follow({
            let up = up.clone();
            move || up.load(std::sync::atomic::Ordering::SeqCst)
        });
        assert!(dialer.next_attempt().await.is_ok());
        let (first, _broker) = silent_stream().await;
        assert!(dialer.opened(Some(&first)));
        set(&up, true);
        dialer.connected();
        // The connection was lost: lapin asks for a stream again.
        set(&up, false);
        assert!(dialer.next_attempt().await.is_ok());
        let (stream, broker) = silent_stream().await;
        assert!(dialer.opened(Some(&stream)));
        (dialer, up, stream, broker)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_handshake_that_gets_no_answer_is_cut_after_its_timeout() {
        let (_dialer, _up, mut stream, _broker) = reconnect_handed_over().await;
        let just_short = HANDSHAKE - Duration::from_millis(100);
        assert!(!ends_within(&mut stream, just_short).await, "cut too early");
        assert!(
            ends_within(&mut stream, Duration::from_millis(200)).await,
            "the handshake was not cut at its timeout"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_handshake_that_ended_is_left_alone() {
        let (dialer, up, mut stream, _broker) = reconnect_handed_over().await;
        set(&up, true);
        assert!(dialer.connected(), "a recovery");
        let well_past = HANDSHAKE * 3;
        assert!(!ends_within(&mut stream, well_past).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_handshake_that_ended_is_left_alone_though_its_report_never_came() {
        let (_dialer, up, mut stream, _broker) = reconnect_handed_over().await;
        // lapin's status says up; the events task has not said so (yet).
        set(&up, true);
        let well_past = HANDSHAKE * 3;
        assert!(!ends_within(&mut stream, well_past).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_report_of_a_recovery_leaves_the_next_handshakes_watchdog_armed() {
        let (dialer, up, _stream, _broker) = reconnect_handed_over().await;
        // That reconnect's handshake ended, the connection was lost again, and the next
        // stream was handed over, all before the events task reported the recovery.
        set(&up, true);
        set(&up, false);
        assert!(dialer.next_attempt().await.is_ok());
        let (mut next, _next_broker) = silent_stream().await;
        assert!(dialer.opened(Some(&next)));
        assert!(dialer.connected(), "the late report, of a recovery");
        assert!(
            ends_within(&mut next, HANDSHAKE + Duration::from_millis(100)).await,
            "the next handshake was not cut at its timeout"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_connect_stops_trying_at_its_deadline() {
        let started = Instant::now();
        let dialer = Dialer::new(String::new(), started + Duration::from_secs(1), HANDSHAKE);
        let mut attempts = 0;
        while let Ok(budget) = dialer.next_attempt().await {
            assert!(budget <= Duration::from_secs(1));
            attempts += 1;
            dialer.failed(io::Error::from(io::ErrorKind::ConnectionRefused), false);
        }
        assert!(attempts > 1, "{attempts}");
        assert!(started.elapsed() >= Duration::from_secs(1));
    }
}
