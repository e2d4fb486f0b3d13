//! A handler cancelled (past its timeout, or at the shutdown timeout) is dropped outside
//! any poll, so a panic while its state is dropped (a guard's `Drop`, say) would escape
//! the `catch_unwind` around its polls, end the mount's task and stop the app.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// A handler's future, dropped inside `catch_unwind`: a panic while it is dropped is
    /// logged and goes no further. Its polls are left to the caller's own
    /// `catch_unwind`. Costs nothing unless the drop panics.
    pub(crate) struct CatchDropPanic<F> {
        #[pin]
        future: Option<F>,
    }

    impl<F> PinnedDrop for CatchDropPanic<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut future = this.project().future;
            if future.is_some() {
                let dropped = catch_unwind(AssertUnwindSafe(|| future.set(None)));
                if dropped.is_err() {
                    tracing::error!(
                        "a handler panicked while its cancelled run was dropped; the mount goes on"
                    );
                }
            }
        }
    }
}

impl<F> CatchDropPanic<F> {
    pub(crate) fn new(future: F) -> Self {
        CatchDropPanic {
            future: Some(future),
        }
    }
}

impl<F: Future> Future for CatchDropPanic<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.project().future.as_pin_mut() {
            Some(future) => future.poll(cx),
            // Only `drop` takes the future out, so it is always there to poll.
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct PanicsOnDrop;

    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("dropped");
        }
    }

    #[test]
    fn a_panic_while_the_future_is_dropped_goes_no_further() {
        let guard = PanicsOnDrop;
        let future = async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        };
        let mut wrapped = Box::pin(CatchDropPanic::new(future));
        assert!(
            wrapped
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()))
                .is_pending()
        );
        drop(wrapped);
    }
}
