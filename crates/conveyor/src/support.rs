//! Small building blocks that every transport needs in the same shape, kept here so each
//! is written once: a lock that outlives a panic, and a wait on a [`Notify`] for a
//! condition that misses no wake-up.

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
/// *conveyor::support::lock(&counter) += 1;
/// assert_eq!(*conveyor::support::lock(&counter), 1);
/// ```
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits until `check` finds something, checking again each time `notify` wakes its
/// waiters.
///
/// The waiter is registered before each check, so a `notify_waiters` that comes between
/// the check and the wait is not lost.
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
/// conveyor::support::wait_for(&changed, || ready.load(Ordering::SeqCst).then_some(())).await;
/// # }
/// ```
pub async fn wait_for<T>(notify: &Notify, mut check: impl FnMut() -> Option<T>) -> T {
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

/// `name` as an error text quotes it: whole up to `max_chars` characters, else its first
/// `max_chars` and `…`, cut at a character boundary, so that a megabyte-long name does not
/// make a megabyte-long error. Control characters are escaped, so the name stays on its
/// line. Borrows when there is nothing to change.
///
/// ```
/// assert_eq!(conveyor::support::bounded("orders", 64), "orders");
/// assert_eq!(conveyor::support::bounded("abcdef", 3), "abc…");
/// assert_eq!(conveyor::support::bounded("a\nb", 64), "a\\nb");
/// ```
pub fn bounded(name: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    let cut = name.char_indices().nth(max_chars).map(|(end, _)| end);
    let kept = name.get(..cut.unwrap_or(name.len())).unwrap_or(name);
    if cut.is_none() && !kept.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut text = String::with_capacity(kept.len().saturating_add(3));
    for c in kept.chars() {
        if c.is_control() {
            text.extend(c.escape_debug());
        } else {
            text.push(c);
        }
    }
    if cut.is_some() {
        text.push('…');
    }
    std::borrow::Cow::Owned(text)
}
