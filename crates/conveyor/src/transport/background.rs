//! A subscription's background work, run on whichever task adopts it.

use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The work a subscription needs done while it is open, beside the dispatcher's calls
/// (receiving ahead, making settlement calls), handed to the dispatcher by
/// [`Subscriber::background`](crate::Subscriber::background) so that the mount's own
/// task runs it side by side with its handlers: a hand-over between the two is then a
/// poll on the same task, not a wake-up of another task (and often of another thread).
///
/// It finishes once the subscription has closed and its last settlement call is made.
/// Dropped before that, it carries on in a task of its own, so nothing it owes the broker
/// is left undone; outside a Tokio runtime (where nothing could run it) it is dropped.
///
/// ```
/// use conveyor::Background;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (done, finished) = tokio::sync::oneshot::channel();
/// let background = Background::new(async move {
///     let _ = done.send(());
/// });
/// // Not polled: dropping it runs it in a task of its own.
/// drop(background);
/// assert!(finished.await.is_ok());
/// # }
/// ```
pub struct Background {
    work: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Background {
    /// The background work `work`.
    pub fn new(work: impl Future<Output = ()> + Send + 'static) -> Self {
        Background {
            work: Some(Box::pin(work)),
        }
    }

    /// Whether the work has finished.
    pub fn is_finished(&self) -> bool {
        self.work.is_none()
    }
}

impl Future for Background {
    type Output = ();

    /// Runs the work; once it has finished, ready at once. Work that panics is
    /// finished too: it is not run again when this is dropped.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(());
        };
        let done = match catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(done) => done,
            Err(panic) => {
                self.work = None;
                resume_unwind(panic);
            }
        };
        if done.is_ready() {
            self.work = None;
        }
        done
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(work) = self.work.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(work);
        }
    }
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("finished", &self.is_finished())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_background_polled_to_its_end_is_not_run_again_when_dropped() {
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = runs.clone();
        let mut background = Background::new(async move {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        (&mut background).await;
        assert!(background.is_finished());
        (&mut background).await;
        drop(background);
        tokio::task::yield_now().await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_background_whose_work_panicked_is_not_run_again_when_dropped() {
        let mut background = Background::new(async {
            panic!("a transport bug");
        });
        let polled = catch_unwind(AssertUnwindSafe(|| {
            futures_util::FutureExt::now_or_never(&mut background)
        }));
        assert!(polled.is_err(), "the panic goes on to the caller");
        assert!(background.is_finished());
        // Dropping it spawns nothing (the work would panic again, "resumed after
        // panicking").
        drop(background);
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        assert_eq!(tasks, 0);
    }

    #[tokio::test]
    async fn a_background_dropped_half_way_finishes_in_a_task_of_its_own() {
        let (go, gate) = tokio::sync::oneshot::channel::<()>();
        let (done, finished) = tokio::sync::oneshot::channel();
        let mut background = Background::new(async move {
            let _ = gate.await;
            let _ = done.send(());
        });
        // Polled once: it waits at the gate.
        assert!(futures_util::FutureExt::now_or_never(&mut background).is_none());
        drop(background);
        let _ = go.send(());
        assert!(finished.await.is_ok(), "the work went on after the drop");
    }
}
