//! The settle task a transport runs per subscription: the core's synchronous
//! [`Settle`](crate::Settle) calls queue settlements, and one task performs them on the
//! broker, batching what it can and running slow ones beside the rest.
//!
//! A transport gives a [`Perform`]: each settlement becomes either a plain frame, sent
//! together with the others of its batch (an AMQP ack or nack), or a rest, a future that
//! runs beside later settlements (a republish, its confirm, then the ack of the
//! original). [`SettleDriver::start`] spawns the task; [`push`](SettleDriver::push)
//! queues, [`flush`](SettleDriver::flush) waits for what was queued before it, and
//! dropping the driver lets the task finish what is under way and end.
//!
//! The task takes settlements in the order they were queued, all that are queued at a
//! time (up to 256). The plain frames of such a batch are handed to [`Perform::send`]
//! together and awaited as one, so the task does not wait for each before the next; what
//! is settled while a batch is being written goes in the next. At most `max_rests` rests
//! run at once: past that, the task takes no further settlement until one ends.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::oneshot;

use super::settle::SettleQueue;

/// What the settle task is asked to do. A settlement is not boxed: nearly every op is
/// one, and boxing would cost an allocation per message.
enum Op<J> {
    Settle(J),
    Flush(oneshot::Sender<()>),
}

/// The handle of a subscription's settle task: queues its settlements.
///
/// ```
/// use conveyor::kit::{Perform, SettleDriver, Started};
/// use futures_util::future::BoxFuture;
///
/// /// Acks by printing them, a batch at a time.
/// struct Print;
///
/// impl Perform for Print {
///     type Job = u64;
///     type Plain = u64;
///     fn start(&self, tag: u64) -> Started<u64> {
///         Started::Plain(tag)
///     }
///     fn send(&self, tags: Vec<u64>) -> BoxFuture<'static, ()> {
///         Box::pin(async move { println!("ack {tags:?}") })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (driver, task) = SettleDriver::start(Print, 64);
/// driver.push(1);
/// driver.push(2);
/// driver.flush().await; // both acks are sent
/// drop(driver);
/// task.await.unwrap(); // and the task ends
/// # }
/// ```
pub struct SettleDriver<J> {
    ops: Arc<SettleQueue<Op<J>>>,
}

impl<J: Send + 'static> SettleDriver<J> {
    /// Spawns the task that performs the settlements with `perform`, running at most
    /// `max_rests` rests at once (at least one); gives the handle and the task.
    pub fn start<P: Perform<Job = J>>(
        perform: P,
        max_rests: usize,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let ops = Arc::new(SettleQueue::new());
        let task = tokio::spawn(run(ops.clone(), perform, max_rests.max(1)));
        (SettleDriver { ops }, task)
    }

    /// Queues `job`. Never blocks; if the task has ended, the job is dropped.
    pub fn push(&self, job: J) {
        self.ops.push(Op::Settle(job));
    }

    /// Waits until every settlement queued before this call has been performed, rests
    /// included. The place in the queue is taken at the call, not when the future is first
    /// polled. (Should the task have died, this never ends: race it with the task.)
    pub fn flush(&self) -> impl Future<Output = ()> + Send + 'static {
        let (done, flushed) = oneshot::channel();
        self.ops.push(Op::Flush(done));
        async move {
            let _ = flushed.await;
        }
    }
}

/// Nothing more comes: the task ends once what is under way has finished.
impl<J> Drop for SettleDriver<J> {
    fn drop(&mut self) {
        self.ops.close();
    }
}

/// A transport's side of the settle task: what each settlement becomes on its broker.
///
/// [`start`](Self::start) turns a settlement into a plain frame (an AMQP ack or nack:
/// [`Started::Plain`]), which [`send`](Self::send) sends with the others of its batch,
/// or into a rest (a republish, its confirm, then the ack of the original:
/// [`Started::Rest`]), which runs beside later settlements.
pub trait Perform: Send + 'static {
    /// One settlement, as the transport's [`Settle`](crate::Settle) queues it.
    type Job: Send + 'static;
    /// What a plain settlement becomes: one frame of a batch.
    type Plain: Send + 'static;
    /// Starts `job`: a frame for the next batch, or a rest to run beside the others.
    fn start(&self, job: Self::Job) -> Started<Self::Plain>;
    /// Sends `plain` in order, all at once: the future ends when every one has been
    /// written (or has failed).
    fn send(&self, plain: Vec<Self::Plain>) -> BoxFuture<'static, ()>;
}

/// What starting a settlement gave.
pub enum Started<P> {
    /// One frame to send with the others of its batch.
    Plain(P),
    /// The rest, to run beside later settlements.
    Rest(BoxFuture<'static, ()>),
}

/// How many ops the task takes at once: the plain frames among them are sent together.
const BATCH: usize = 256;

/// Performs `ops` in order, a batch of what is queued at a time, with up to `max_rests`
/// rests (see [`Perform`]; a batch's plain frames are one) running beside them; a flush
/// is answered once every rest begun before it has finished.
///
/// The acks and nacks of a batch are handed to lapin together and awaited as one, so
/// that they leave in as few writes as lapin can make of them, instead of one ack, one
/// write and one wake-up after another. While one batch of frames is being written, the
/// next gathers whatever is settled meanwhile: the task never waits on the broker, and
/// the acks that go next can cover each other (AMQP's `multiple`), which they cannot
/// while those before them are unwritten.
async fn run<P: Perform>(ops: Arc<SettleQueue<Op<P::Job>>>, perform: P, max_rests: usize) {
    let mut underway = Underway::default();
    // Each waiting flush, with the number of the first rest begun after it.
    let mut flushes: VecDeque<(u64, oneshot::Sender<()>)> = VecDeque::new();
    let mut batch = Vec::with_capacity(BATCH);
    let mut plain = Vec::new();
    // The number of the batch of frames being written, if one is.
    let mut writing: Option<u64> = None;
    loop {
        let room = max_rests.saturating_sub(underway.rests.len()).min(BATCH);
        tokio::select! {
            biased;
            Some(number) = underway.rests.next(), if !underway.rests.is_empty() => {
                underway.numbers.remove(&number);
                if writing == Some(number) {
                    writing = None;
                    if !plain.is_empty() {
                        writing = Some(underway.begin(perform.send(std::mem::take(&mut plain))));
                    }
                }
                while let Some((after, _)) = flushes.front() {
                    if underway.numbers.first().is_some_and(|first| first < after) {
                        break;
                    }
                    if let Some((_, done)) = flushes.pop_front() {
                        let _ = done.send(());
                    }
                }
            }
            ready = ops.ready(1, Duration::ZERO), if room > 0 => {
                if !ready {
                    break;
                }
                ops.take(room, &mut batch);
                for op in batch.drain(..) {
                    match op {
                        Op::Flush(done) => {
                            // What came before the flush is under way before it is.
                            if !plain.is_empty() {
                                writing = Some(underway.begin(perform.send(std::mem::take(&mut plain))));
                            }
                            if underway.numbers.is_empty() {
                                let _ = done.send(());
                            } else {
                                flushes.push_back((underway.next, done));
                            }
                        }
                        Op::Settle(job) => match perform.start(job) {
                            Started::Plain(frame) => plain.push(frame),
                            Started::Rest(rest) => {
                                underway.begin(rest);
                            }
                        },
                    }
                }
                if !plain.is_empty() && writing.is_none() {
                    writing = Some(underway.begin(perform.send(std::mem::take(&mut plain))));
                }
            },
        }
    }
    // The settler is gone: what it settled last still goes, and the confirms under way
    // still settle their originals.
    if !plain.is_empty() {
        underway.begin(perform.send(plain));
    }
    while underway.rests.next().await.is_some() {}
}

/// The rests under way, numbered in the order they began.
#[derive(Default)]
struct Underway {
    rests: FuturesUnordered<Numbered>,
    numbers: BTreeSet<u64>,
    next: u64,
}

impl Underway {
    /// Runs `rest`; returns its number.
    fn begin(&mut self, rest: BoxFuture<'static, ()>) -> u64 {
        let number = self.next;
        self.next = self.next.wrapping_add(1);
        self.numbers.insert(number);
        self.rests.push(Numbered { rest, number });
        number
    }
}

/// A rest that ends with its number.
struct Numbered {
    rest: BoxFuture<'static, ()>,
    number: u64,
}

impl Future for Numbered {
    type Output = u64;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u64> {
        let number = self.number;
        self.rest.as_mut().poll(cx).map(|()| number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// The rests the scripted task runs at once.
    const MAX_RESTS: usize = 1024;

    /// A scripted settlement: done at once, or (a republish) done when its confirm comes.
    enum Step {
        Done(&'static str),
        Confirm(&'static str, oneshot::Receiver<()>),
    }

    /// Performs steps by recording their names, in the order they are done, and counts
    /// the batches of plain frames sent; each batch is written once it gets a permit of
    /// the semaphore.
    struct Script(
        mpsc::UnboundedSender<&'static str>,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<tokio::sync::Semaphore>,
    );

    fn unlimited() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(
            tokio::sync::Semaphore::MAX_PERMITS,
        ))
    }

    impl Perform for Script {
        type Job = Step;
        type Plain = &'static str;

        fn start(&self, step: Step) -> Started<&'static str> {
            match step {
                Step::Done(name) => Started::Plain(name),
                Step::Confirm(name, confirm) => {
                    let done = self.0.clone();
                    Started::Rest(Box::pin(async move {
                        let _ = confirm.await;
                        let _ = done.send(name);
                    }))
                }
            }
        }

        fn send(&self, plain: Vec<&'static str>) -> BoxFuture<'static, ()> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let done = self.0.clone();
            let written = self.2.clone();
            Box::pin(async move {
                if let Ok(permit) = written.acquire().await {
                    permit.forget();
                }
                for name in plain {
                    let _ = done.send(name);
                }
            })
        }
    }

    /// A settle task running [`Script`] with room for `max_rests` rests: where to queue
    /// ops, and what it has done.
    fn scripted() -> (
        Arc<SettleQueue<Op<Step>>>,
        mpsc::UnboundedReceiver<&'static str>,
    ) {
        let ops = Arc::new(SettleQueue::new());
        let (done, performed) = mpsc::unbounded_channel();
        tokio::spawn(run(
            ops.clone(),
            Script(done, Arc::default(), unlimited()),
            MAX_RESTS,
        ));
        (ops, performed)
    }

    #[tokio::test(start_paused = true)]
    async fn the_acks_queued_together_are_sent_together_in_order() {
        let ops = Arc::new(SettleQueue::new());
        let (done, mut performed) = mpsc::unbounded_channel();
        let batches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Queued before the task first runs: one batch.
        for name in ["ack 1", "nack 2", "ack 3"] {
            ops.push(Op::Settle(Step::Done(name)));
        }
        tokio::spawn(run(
            ops,
            Script(done, batches.clone(), unlimited()),
            MAX_RESTS,
        ));
        for name in ["ack 1", "nack 2", "ack 3"] {
            assert_eq!(now(performed.recv()).await, Some(name));
        }
        assert_eq!(batches.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn acks_settled_while_a_batch_is_written_go_together_after_it() {
        let ops = Arc::new(SettleQueue::new());
        let (done, mut performed) = mpsc::unbounded_channel();
        let batches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let written = Arc::new(tokio::sync::Semaphore::new(0));
        tokio::spawn(run(
            ops.clone(),
            Script(done, batches.clone(), written.clone()),
            MAX_RESTS,
        ));
        ops.push(Op::Settle(Step::Done("ack 1")));
        assert!(
            stuck(performed.recv()).await,
            "the first batch is being written"
        );
        ops.push(Op::Settle(Step::Done("ack 2")));
        ops.push(Op::Settle(Step::Done("ack 3")));
        assert!(
            stuck(performed.recv()).await,
            "the first batch is still being written"
        );
        assert_eq!(batches.load(std::sync::atomic::Ordering::SeqCst), 1);

        written.add_permits(1);
        assert_eq!(now(performed.recv()).await, Some("ack 1"));
        written.add_permits(1);
        assert_eq!(now(performed.recv()).await, Some("ack 2"));
        assert_eq!(now(performed.recv()).await, Some("ack 3"));
        assert_eq!(batches.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_settled_last_is_still_sent_when_the_settler_is_gone() {
        let ops = Arc::new(SettleQueue::new());
        let (done, mut performed) = mpsc::unbounded_channel();
        let written = Arc::new(tokio::sync::Semaphore::new(0));
        tokio::spawn(run(
            ops.clone(),
            Script(done, Arc::default(), written.clone()),
            MAX_RESTS,
        ));
        ops.push(Op::Settle(Step::Done("ack 1")));
        assert!(
            stuck(performed.recv()).await,
            "the first batch is being written"
        );
        ops.push(Op::Settle(Step::Done("ack 2")));
        ops.close();
        written.add_permits(2);
        assert_eq!(now(performed.recv()).await, Some("ack 1"));
        assert_eq!(now(performed.recv()).await, Some("ack 2"));
        assert_eq!(now(performed.recv()).await, None, "then the task ends");
    }

    /// Queues a flush, and returns what answers it.
    fn flush(ops: &SettleQueue<Op<Step>>) -> oneshot::Receiver<()> {
        let (done, flushed) = oneshot::channel();
        ops.push(Op::Flush(done));
        flushed
    }

    /// Whether `future` is still waiting once everything else has run: the clock is
    /// paused, so it only moves (to the timeout) when no task can make progress.
    async fn stuck<F: Future>(future: F) -> bool {
        tokio::time::timeout(Duration::from_secs(3600), future)
            .await
            .is_err()
    }

    /// What `future` gives, failing if it is [`stuck`].
    async fn now<F: Future>(future: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(3600), future)
            .await
            .expect("it is stuck")
    }

    #[tokio::test(start_paused = true)]
    async fn settlements_after_a_republish_do_not_wait_for_its_confirm() {
        let (ops, mut performed) = scripted();
        let (confirm, confirmation) = oneshot::channel();
        ops.push(Op::Settle(Step::Confirm("retry", confirmation)));
        ops.push(Op::Settle(Step::Done("ack 1")));
        ops.push(Op::Settle(Step::Done("nack 2")));
        assert_eq!(now(performed.recv()).await, Some("ack 1"));
        assert_eq!(now(performed.recv()).await, Some("nack 2"));
        assert!(stuck(performed.recv()).await, "nothing else is done");

        confirm.send(()).unwrap();
        assert_eq!(now(performed.recv()).await, Some("retry"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_waits_for_the_confirms_queued_before_it_and_only_those() {
        let (ops, mut performed) = scripted();
        let (first, first_confirmation) = oneshot::channel();
        let (second, second_confirmation) = oneshot::channel();
        ops.push(Op::Settle(Step::Confirm("first", first_confirmation)));
        ops.push(Op::Settle(Step::Done("ack")));
        let mut flushed = flush(&ops);
        ops.push(Op::Settle(Step::Confirm("second", second_confirmation)));
        let mut flushed_later = flush(&ops);

        assert!(
            stuck(&mut flushed).await,
            "the first republish is not confirmed yet"
        );
        assert_eq!(now(performed.recv()).await, Some("ack"));
        first.send(()).unwrap();
        now(flushed).await.unwrap();
        assert_eq!(now(performed.recv()).await, Some("first"));
        assert!(
            stuck(&mut flushed_later).await,
            "the second one is not confirmed yet"
        );

        second.send(()).unwrap();
        now(flushed_later).await.unwrap();
        assert_eq!(now(performed.recv()).await, Some("second"));
        // With nothing under way, a flush is answered at once.
        now(flush(&ops)).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_republishes_waiting_for_confirms_are_bounded() {
        let (ops, mut performed) = scripted();
        let mut confirms = Vec::new();
        for _ in 0..MAX_RESTS {
            let (confirm, confirmation) = oneshot::channel();
            confirms.push(confirm);
            ops.push(Op::Settle(Step::Confirm("held", confirmation)));
        }
        ops.push(Op::Settle(Step::Done("ack")));
        assert!(stuck(performed.recv()).await, "the ack waits for room");
        confirms.pop().unwrap().send(()).unwrap();
        assert_eq!(now(performed.recv()).await, Some("held"));
        assert_eq!(now(performed.recv()).await, Some("ack"));
    }

    #[tokio::test(start_paused = true)]
    async fn confirms_under_way_still_finish_when_the_settler_is_gone() {
        let (ops, mut performed) = scripted();
        let (confirm, confirmation) = oneshot::channel();
        ops.push(Op::Settle(Step::Confirm("retry", confirmation)));
        ops.close();
        confirm.send(()).unwrap();
        assert_eq!(now(performed.recv()).await, Some("retry"));
        assert_eq!(now(performed.recv()).await, None, "then the task ends");
    }
}
