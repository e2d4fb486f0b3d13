//! Two futures run to their ends on one task, each polled only when it was woken: a
//! mount's dispatch and its subscription's background work; within that background, a
//! pulling subscription's pump and keeper.
//!
//! The two hand each other work all the time: the dispatcher settles a delivery and the
//! background makes the call, the background receives and the dispatcher takes what came.
//! Each hand-over wakes the other side. A plain join would pass such a wake to the task,
//! which, woken while it is being polled, goes to the back of the runtime's queue and has
//! an idle worker thread woken to look at it: a futex wake and a context switch for a
//! hand-over within one task. Here a wake made while the pair is being polled only marks
//! the side woken, and the same poll goes round again for it; only a wake from outside
//! (an answer from the broker, a timer) wakes the task. A side not woken is not polled:
//! a join that polls both every time would run the other's whole wait again (a keeper's
//! select over four signals) for nothing.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Runs `dispatch` and `background` (for a pulling subscription's own background, its
/// pump and its keeper) to their ends on the calling task; the first one's output.
pub(crate) async fn beside<T>(
    dispatch: impl Future<Output = T>,
    background: impl Future<Output = ()>,
) -> T {
    let shared = Arc::new(Shared {
        woken: [AtomicBool::new(true), AtomicBool::new(true)],
        polling: AtomicBool::new(false),
        task: AtomicWaker::new(),
    });
    let wakers = [0, 1].map(|side| {
        Waker::from(Arc::new(SideWaker {
            side,
            shared: shared.clone(),
        }))
    });
    let mut dispatch = pin!(dispatch);
    let mut background = pin!(background);
    let (mut output, mut background_done) = (None, false);
    std::future::poll_fn(|cx| {
        shared.task.register(cx.waker());
        let mut rounds = 0;
        loop {
            shared.polling.store(true, Ordering::SeqCst);
            loop {
                rounds += 1;
                if rounds > ROUNDS_PER_POLL {
                    // Enough for one turn: the rest waits for the next, after the
                    // runtime's other tasks had theirs.
                    shared.polling.store(false, Ordering::SeqCst);
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let mut polled = false;
                if output.is_none() && shared.woken[0].swap(false, Ordering::AcqRel) {
                    polled = true;
                    if let Poll::Ready(out) =
                        dispatch.as_mut().poll(&mut Context::from_waker(&wakers[0]))
                    {
                        output = Some(out);
                    }
                }
                if !background_done && shared.woken[1].swap(false, Ordering::AcqRel) {
                    polled = true;
                    background_done = background
                        .as_mut()
                        .poll(&mut Context::from_waker(&wakers[1]))
                        .is_ready();
                }
                if !polled {
                    break;
                }
            }
            if background_done && let Some(out) = output.take() {
                return Poll::Ready(out);
            }
            shared.polling.store(false, Ordering::SeqCst);
            // A wake between the last look and the store above saw `polling` still set
            // and left the task asleep: look once more.
            let missed = (output.is_none() && shared.woken[0].load(Ordering::SeqCst))
                || (!background_done && shared.woken[1].load(Ordering::SeqCst));
            if !missed {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// How many times one poll goes round the two sides before it lets the runtime's other
/// tasks run: a hand-over that needs another task (an answer from the broker) ends a
/// poll long before that, but a side that yields by waking itself (a handler's own
/// `yield_now`, a `FuturesUnordered` done with its turn) would otherwise be polled again
/// and again, and on a current-thread runtime the task it waits for would never run.
const ROUNDS_PER_POLL: usize = 32;

/// What the two sides' wakers share with the poll.
struct Shared {
    /// Which side was woken since it was last polled.
    woken: [AtomicBool; 2],
    /// The pair is being polled: a wake marks its side, and the poll goes round again.
    polling: AtomicBool,
    /// The task polling the pair.
    task: AtomicWaker,
}

/// One side's waker.
struct SideWaker {
    side: usize,
    shared: Arc<Shared>,
}

impl Wake for SideWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.woken[self.side].store(true, Ordering::SeqCst);
        if !self.shared.polling.load(Ordering::SeqCst) {
            self.shared.task.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::{Notify, oneshot};

    use super::*;

    /// Ten hand-overs each way, each a wake of the other side, cost the task no wake at
    /// all: the whole exchange runs in the first poll. (A plain join has its task woken
    /// for them.)
    #[test]
    fn hand_overs_between_the_sides_run_in_one_poll_without_waking_the_task() {
        let to_background = Arc::new(Notify::new());
        let to_dispatch = Arc::new(Notify::new());
        let (a, b) = (to_background.clone(), to_dispatch.clone());
        let dispatch = async move {
            for _ in 0..10 {
                let answered = b.notified();
                a.notify_one();
                answered.await;
            }
            "done"
        };
        let background = async move {
            for _ in 0..10 {
                to_background.notified().await;
                to_dispatch.notify_one();
            }
        };
        let wakes = Arc::new(CountWakes::default());
        let waker = Waker::from(wakes.clone());
        let mut pair = pin!(beside(dispatch, background));
        let out = pair.as_mut().poll(&mut Context::from_waker(&waker));
        assert_eq!(out, Poll::Ready("done"), "the whole exchange in one poll");
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            0,
            "a hand-over woke the task"
        );
    }

    #[derive(Default)]
    struct CountWakes(std::sync::atomic::AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A side that yields by waking itself, waiting for another task, lets that task
    /// run: on a current-thread runtime, polling it again within the same poll for ever
    /// would never let the other task set the flag.
    #[tokio::test(flavor = "current_thread")]
    async fn a_side_that_yields_by_waking_itself_lets_the_other_tasks_run() {
        let flag = Arc::new(AtomicBool::new(false));
        let set = flag.clone();
        tokio::spawn(async move { set.store(true, Ordering::SeqCst) });
        let mut yields = 0u32;
        let waiting = std::future::poll_fn(move |cx| {
            if flag.load(Ordering::SeqCst) {
                return Poll::Ready(yields);
            }
            yields += 1;
            assert!(yields < 1_000_000, "the other task never ran");
            cx.waker().wake_by_ref();
            Poll::Pending
        });
        let yields = beside(waiting, async {}).await;
        assert!(yields > 0);
    }

    #[tokio::test]
    async fn a_wake_from_another_task_wakes_the_pair() {
        let (send, answer) = oneshot::channel();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            let _ = send.send(7);
        });
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            beside(async { answer.await.unwrap_or(0) }, async {}),
        )
        .await
        .expect("woken from outside");
        assert_eq!(out, 7);
    }

    #[tokio::test]
    async fn the_dispatch_output_waits_for_the_background_to_finish() {
        let (send, finished) = oneshot::channel::<()>();
        let finishing = async move {
            let _ = finished.await;
        };
        let pair = tokio::spawn(beside(async { 1 }, finishing));
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert!(!pair.is_finished(), "the background still runs");
        let _ = send.send(());
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(60), pair)
                .await
                .expect("ends once both have")
                .ok(),
            Some(1)
        );
    }
}
