//! Locks and wake-ups as every transport needs them.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// Locks `mutex`, even if a thread panicked while holding it.
///
/// Conveyor's locks guard bookkeeping that a panic cannot leave half-changed in a way
/// that matters more than stopping every delivery would (each critical section is a few
/// plain assignments, and panics in user code are caught outside them), so poisoning is
/// ignored rather than spread.
///
/// ```
/// use std::sync::Mutex;
///
/// let counter = Mutex::new(0);
/// *conveyor::kit::lock(&counter) += 1;
/// assert_eq!(*conveyor::kit::lock(&counter), 1);
/// ```
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits until `check` finds something, checking again each time `notify` wakes its
/// waiters.
///
/// A first check is made before any waiter is registered: when what is waited for is
/// there already (the common case on a busy subscription), the `Notify`'s own lock is
/// never taken. After that, the waiter is registered before each check, so a
/// `notify_waiters` that comes between the check and the wait is not lost. `check` may
/// run once more than it finds nothing, so it must change nothing when it finds nothing.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use tokio::sync::Notify;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (ready, changed) = (Arc::new(AtomicBool::new(false)), Arc::new(Notify::new()));
/// let (r, c) = (ready.clone(), changed.clone());
/// tokio::spawn(async move {
///     r.store(true, Ordering::SeqCst);
///     c.notify_waiters();
/// });
/// conveyor::kit::wait_for(&changed, || ready.load(Ordering::SeqCst).then_some(())).await;
/// # }
/// ```
pub async fn wait_for<T>(notify: &Notify, mut check: impl FnMut() -> Option<T>) -> T {
    if let Some(found) = check() {
        return found;
    }
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(found) = check() {
            return found;
        }
        notified.await;
    }
}
