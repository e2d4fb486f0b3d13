//! The transport kit: what every transport needs in the same shape, written once.
//!
//! - Settling: the table of deliveries not settled yet ([`TagTable`]), the queue their
//!   settlements wait in ([`SettleQueue`]), and the settle task that performs them in
//!   batches with slow ones beside the rest ([`SettleDriver`], given a [`Perform`]).
//! - Pacing: the pause between retries of a failing broker call, doubling
//!   ([`RetryPause`]), and the instant a delay ends ([`due_after`]).
//! - Small pieces: a lock that outlives a panic ([`lock`]), a wait on a [`Notify`] for a
//!   condition that misses no wake-up ([`wait_for`]), error texts that quote a name
//!   boundedly ([`bounded`]), URLs with their password hidden ([`redact_url`],
//!   [`url_password`]), and ids no one else makes ([`unique_id`]).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::policy::Backoff;

mod driver;

pub use driver::{Perform, SettleDriver, Started};

/// An id no other call in this process returns, nor (by its clock) any call in another
/// process: the clock in nanoseconds, the process id and a count, in hex, joined by `-`.
/// For deduplication ids, correlation prefixes and the like.
///
/// ```
/// let (a, b) = (conveyor::kit::unique_id(), conveyor::kit::unique_id());
/// assert_ne!(a, b);
/// ```
pub fn unique_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};

    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{count:x}", std::process::id())
}

/// The instant `delay` from now, for a delay that comes from outside (user settings, a
/// handler's retry-after): one too long for the clock means never, in practice, rather
/// than the overflow panic of `Instant + Duration`.
///
/// ```
/// use std::time::Duration;
///
/// let far = conveyor::kit::due_after(Duration::MAX);
/// assert!(far > tokio::time::Instant::now() + Duration::from_secs(50 * 365 * 24 * 3600));
/// ```
pub fn due_after(delay: Duration) -> tokio::time::Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
    let now = tokio::time::Instant::now();
    now.checked_add(delay)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

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
/// conveyor::kit::wait_for(&changed, || ready.load(Ordering::SeqCst).then_some(())).await;
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
/// assert_eq!(conveyor::kit::bounded("orders", 64), "orders");
/// assert_eq!(conveyor::kit::bounded("abcdef", 3), "abc…");
/// assert_eq!(conveyor::kit::bounded("a\nb", 64), "a\\nb");
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

/// `url` with the password, if any, replaced by `***`: safe to log, or to quote in an
/// error.
///
/// A password should be percent-encoded, but people paste raw ones, with `/`, `?`, `#`,
/// `@` or `:` in them. So the user information is taken to end at the *last* `@` of the
/// URL, not at the first `/`: whatever could be a password is hidden, at the price of
/// hiding a little more than needed for the rare URL with an `@` in its path or query.
/// A URL mistyped with one slash after its scheme, or none, is redacted all the same (a
/// prefix followed by no slash counts as a scheme only if it is one of the transports'
/// own, `amqp`, `amqps`, `http` or `https`, so that in `user:password@host` the user is
/// not taken for one).
///
/// ```
/// use conveyor::kit::redact_url;
///
/// assert_eq!(redact_url("amqp://app:s3cret@rabbit:5672/prod"), "amqp://app:***@rabbit:5672/prod");
/// assert_eq!(redact_url("https://app:ab/cd@gw.example/q"), "https://app:***@gw.example/q");
/// assert_eq!(redact_url("amqp:/app:s3cret@rabbit/prod"), "amqp:/app:***@rabbit/prod");
/// assert_eq!(redact_url("http://127.0.0.1:4566/123/q"), "http://127.0.0.1:4566/123/q");
/// ```
pub fn redact_url(url: &str) -> String {
    match url_password_range(url) {
        Some(range) => format!(
            "{}***{}",
            url.get(..range.start).unwrap_or_default(),
            url.get(range.end..).unwrap_or_default()
        ),
        None => url.to_string(),
    }
}

/// `url`'s password as written (what [`redact_url`] hides), if it has one: for a
/// transport that must also hide it where a library quotes it in its own words.
///
/// ```
/// use conveyor::kit::url_password;
///
/// assert_eq!(url_password("amqp://app:s3cret@rabbit/prod"), Some("s3cret"));
/// assert_eq!(url_password("amqp://guest@rabbit"), None);
/// ```
pub fn url_password(url: &str) -> Option<&str> {
    url_password_range(url).and_then(|range| url.get(range))
}

/// Where `url`'s password is: from the colon after the user name to the last `@`.
fn url_password_range(url: &str) -> Option<std::ops::Range<usize>> {
    let start = authority_start(url);
    let authority = url.get(start..)?;
    let at = authority.rfind('@')?;
    let colon = authority.get(..at)?.find(':')?;
    Some(start + colon + 1..start + at)
}

/// Where a URL's user information starts: after the scheme and its slashes, however
/// many. A prefix counts as a scheme only if slashes follow it or it is one of the
/// transports' own, so that in `user:password@host` the user is not taken for a scheme.
fn authority_start(url: &str) -> usize {
    let Some(colon) = url.find(':') else {
        return 0;
    };
    let scheme = &url[..colon];
    let well_formed = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let after = &url[colon + 1..];
    let slashes = after.len() - after.trim_start_matches('/').len();
    let known = ["amqp", "amqps", "http", "https"]
        .iter()
        .any(|known| scheme.eq_ignore_ascii_case(known));
    if well_formed && (slashes > 0 || known) {
        colon + 1 + slashes
    } else {
        0
    }
}

/// What a transport keeps of each delivery until it is settled, under the delivery tag
/// it was given: the one table each transport's deliveries are looked up in.
///
/// Tags are handed out by [`insert`](Self::insert) and never reused while their entry
/// lives; a tag whose entry was removed finds nothing (a second settlement of the same
/// delivery is a no-op). Slots are reused, so the table costs no allocation once it has
/// grown to the number of deliveries in flight, and a lookup is an index, not a hash.
///
/// ```
/// use conveyor::kit::TagTable;
///
/// let mut pending = TagTable::new();
/// let tag = pending.insert("receipt-1");
/// assert_eq!(pending.get(tag), Some(&"receipt-1"));
/// assert_eq!(pending.remove(tag), Some("receipt-1"));
/// assert_eq!(pending.remove(tag), None); // settled twice: nothing the second time
/// ```
#[derive(Debug)]
pub struct TagTable<T> {
    slots: Vec<Slot<T>>,
    /// Indexes of empty slots, to fill before growing.
    free: Vec<u32>,
    len: usize,
}

#[derive(Debug)]
struct Slot<T> {
    /// Bumped each time the slot is filled, so that an old tag of the slot finds nothing.
    generation: u32,
    value: Option<T>,
}

impl<T> Default for TagTable<T> {
    fn default() -> Self {
        TagTable {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> TagTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `value`; returns its tag.
    ///
    /// # Panics
    ///
    /// With 2^32 values kept at once (as `Vec` panics on capacity overflow): each slot
    /// takes at least 8 bytes, so memory runs out first.
    pub fn insert(&mut self, value: T) -> u64 {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(self.slots.len())
                    .unwrap_or_else(|_| panic!("a TagTable holds at most 2^32 values"));
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                index
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.value = Some(value);
        self.len += 1;
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    fn slot(&self, tag: u64) -> Option<&Slot<T>> {
        let slot = self.slots.get((tag & u64::from(u32::MAX)) as usize)?;
        (u64::from(slot.generation) == tag >> 32).then_some(slot)
    }

    /// The value kept under `tag`, if it is still there.
    pub fn get(&self, tag: u64) -> Option<&T> {
        self.slot(tag)?.value.as_ref()
    }

    /// The value kept under `tag`, to change in place.
    pub fn get_mut(&mut self, tag: u64) -> Option<&mut T> {
        let slot = self.slots.get_mut((tag & u64::from(u32::MAX)) as usize)?;
        if u64::from(slot.generation) != tag >> 32 {
            return None;
        }
        slot.value.as_mut()
    }

    /// Takes the value kept under `tag` out of the table.
    pub fn remove(&mut self, tag: u64) -> Option<T> {
        let index = tag & u64::from(u32::MAX);
        let slot = self.slots.get_mut(index as usize)?;
        if u64::from(slot.generation) != tag >> 32 {
            return None;
        }
        let value = slot.value.take()?;
        self.len -= 1;
        // `index` came from a slot that exists, so it fits in u32.
        self.free.push(index as u32);
        Some(value)
    }

    /// Every value kept, with its tag.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            let value = slot.value.as_ref()?;
            Some(((u64::from(slot.generation) << 32) | index as u64, value))
        })
    }

    /// How many values are kept.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no value is kept.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The settlements of one subscription on their way to the task that carries them out
/// (one task per subscription, on every transport): pushed from any thread by the core's
/// synchronous [`Settle`](crate::Settle) calls, taken by the task in batches.
///
/// [`ready`](Self::ready) waits (taking nothing, so it can be raced in a `select!` and
/// cancelled) until a batch is worth taking: one item at least, and `enough` of them or
/// `linger` after the first, whichever comes sooner. [`take`](Self::take) then takes
/// them in order. A transport that batches its broker calls (ten per SQS call) lingers;
/// one that sends each settlement as it comes (an AMQP ack) does not, and still sends
/// together what queued up while it was busy.
///
/// ```
/// use std::time::Duration;
/// use conveyor::kit::SettleQueue;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue = SettleQueue::new();
/// queue.push("ack 1");
/// queue.push("ack 2");
/// assert!(queue.ready(1, Duration::ZERO).await);
/// let mut batch = Vec::new();
/// queue.take(10, &mut batch);
/// assert_eq!(batch, ["ack 1", "ack 2"]);
/// queue.close();
/// assert!(!queue.ready(1, Duration::ZERO).await); // closed, and nothing left
/// # }
/// ```
#[derive(Debug)]
pub struct SettleQueue<T> {
    state: Mutex<Queued<T>>,
    /// Wakes the task waiting in `ready` when an item is pushed, or the queue is closed.
    changed: Notify,
}

#[derive(Debug)]
struct Queued<T> {
    items: std::collections::VecDeque<T>,
    closed: bool,
}

impl<T> Default for SettleQueue<T> {
    fn default() -> Self {
        SettleQueue {
            state: Mutex::new(Queued {
                items: std::collections::VecDeque::new(),
                closed: false,
            }),
            changed: Notify::new(),
        }
    }
}

impl<T> SettleQueue<T> {
    /// An empty, open queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues `item` for the task. Items pushed after [`close`](Self::close) are still
    /// queued (the task takes what is left before it ends).
    pub fn push(&self, item: T) {
        lock(&self.state).items.push_back(item);
        self.changed.notify_one();
    }

    /// No more items are coming: once the queue is empty, [`ready`](Self::ready)
    /// returns `false`.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_one();
    }

    /// How many items wait.
    pub fn len(&self) -> usize {
        lock(&self.state).items.len()
    }

    /// Whether no item waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until at least one item waits, then until `enough` do or `linger` has passed
    /// since, whichever is sooner; `true` then, `false` if the queue is closed and empty.
    /// Takes nothing.
    pub async fn ready(&self, enough: usize, linger: Duration) -> bool {
        let first = wait_for(&self.changed, || {
            let state = lock(&self.state);
            match (state.items.is_empty(), state.closed) {
                (false, _) => Some(true),
                (true, true) => Some(false),
                (true, false) => None,
            }
        })
        .await;
        if !first || linger.is_zero() {
            return first;
        }
        let enough = async {
            wait_for(&self.changed, || {
                let state = lock(&self.state);
                (state.items.len() >= enough || state.closed).then_some(())
            })
            .await;
        };
        let _ = tokio::time::timeout(linger, enough).await;
        true
    }

    /// Takes up to `max` waiting items, oldest first, into `into`; returns how many.
    pub fn take(&self, max: usize, into: &mut Vec<T>) -> usize {
        let mut state = lock(&self.state);
        let count = state.items.len().min(max);
        into.extend(state.items.drain(..count));
        count
    }
}

/// The pause before retrying a broker call that keeps failing (a receive, a reconnect):
/// from 100 ms, doubling with each failure in a row, up to 30 s; back to the shortest
/// after a success.
///
/// ```
/// use std::time::Duration;
/// use conveyor::kit::RetryPause;
///
/// let mut pause = RetryPause::new();
/// assert_eq!(pause.failed(), Duration::from_millis(100));
/// assert_eq!(pause.failed(), Duration::from_millis(200));
/// pause.reset();
/// assert_eq!(pause.failed(), Duration::from_millis(100));
/// ```
#[derive(Clone, Debug)]
pub struct RetryPause {
    backoff: Backoff,
    failures: u32,
}

impl Default for RetryPause {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPause {
    /// The shortest pause.
    pub const MIN: Duration = Duration::from_millis(100);
    /// The longest pause.
    pub const MAX: Duration = Duration::from_secs(30);

    /// No failure yet.
    pub fn new() -> Self {
        RetryPause {
            backoff: Backoff::exponential(Self::MIN, Self::MAX),
            failures: 0,
        }
    }

    /// The pause before the next try, after one more failure.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures)
    }

    /// The pause the next failure will get, without counting one.
    pub fn peek(&self) -> Duration {
        self.backoff.delay(self.failures.saturating_add(1))
    }

    /// How many failures in a row it has counted.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to the shortest pause, after a call that worked.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_password_is_replaced() {
        assert_eq!(
            redact_url("amqps://u:p%40ss@host/vhost?heartbeat=10"),
            "amqps://u:***@host/vhost?heartbeat=10"
        );
        assert_eq!(
            redact_url("http://svc:s3cr3t-pw@127.0.0.1:1/123456789012/q"),
            "http://svc:***@127.0.0.1:1/123456789012/q"
        );
    }

    #[test]
    fn raw_url_passwords_with_url_delimiters_never_show() {
        for password in [
            "ab/cd",
            "a?b",
            "a#b",
            "p@ss",
            "a:b",
            "x/y@z?w#v:u",
            "p%2Fq%40r",
        ] {
            for scheme in ["amqp", "https"] {
                let url = format!("{scheme}://app:{password}@host:5672/prod?heartbeat=10");
                let redacted = redact_url(&url);
                assert_eq!(
                    redacted,
                    format!("{scheme}://app:***@host:5672/prod?heartbeat=10")
                );
                assert!(!redacted.contains(password), "{redacted}");
                assert_eq!(url_password(&url), Some(password));
            }
        }
    }

    #[test]
    fn passwords_of_urls_mistyped_without_both_slashes_never_show() {
        for (url, redacted) in [
            ("amqp:/app:s3cret@h/prod", "amqp:/app:***@h/prod"),
            ("amqp:app:s3cret@h/prod", "amqp:app:***@h/prod"),
            ("AMQPS:app:s3cret@h", "AMQPS:app:***@h"),
            ("amqp:///app:s3cret@h", "amqp:///app:***@h"),
            ("http:app:s3cret@h/q", "http:app:***@h/q"),
            ("app:s3cret@h:5672", "app:***@h:5672"),
            ("app:s3:cret@h", "app:***@h"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
    }

    #[test]
    fn urls_without_a_password_are_unchanged() {
        for url in [
            "amqp://guest@h",
            "amqp://h/a@b",
            "not a url",
            "rabbit:5672",
            "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
            "orders",
        ] {
            assert_eq!(redact_url(url), url);
            assert_eq!(url_password(url), None, "{url}");
        }
    }

    #[test]
    fn a_tag_finds_its_value_until_removed_and_never_a_later_one_in_its_slot() {
        let mut table = TagTable::new();
        let first = table.insert('a');
        let second = table.insert('b');
        assert_ne!(first, second);
        assert_eq!(table.len(), 2);
        assert_eq!(table.remove(first), Some('a'));
        // The slot is reused, under a new tag: the old one finds nothing.
        let third = table.insert('c');
        assert_ne!(third, first);
        assert_eq!(table.get(first), None);
        assert_eq!(table.remove(first), None);
        assert_eq!(table.get(third), Some(&'c'));
        if let Some(value) = table.get_mut(second) {
            *value = 'B';
        }
        let mut all: Vec<_> = table.iter().map(|(tag, v)| (tag, *v)).collect();
        all.sort();
        let mut expected = vec![(second, 'B'), (third, 'c')];
        expected.sort();
        assert_eq!(all, expected);
        assert_eq!(table.len(), 2);
        // A tag the table never gave out finds nothing.
        assert_eq!(table.get(u64::MAX), None);
        assert_eq!(table.remove(u64::MAX), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_ready_when_enough_wait_or_the_linger_has_passed() {
        use std::sync::Arc;

        let queue = Arc::new(SettleQueue::new());
        let linger = Duration::from_millis(5);
        // Nothing waits: not ready, however long.
        let waiting = tokio::time::timeout(Duration::from_secs(60), queue.ready(1, linger));
        assert!(waiting.await.is_err());

        // One waits: ready once the linger has passed, and no sooner.
        queue.push(1);
        let started = tokio::time::Instant::now();
        assert!(queue.ready(3, linger).await);
        assert_eq!(started.elapsed(), linger);

        // Enough wait: ready at once.
        queue.push(2);
        queue.push(3);
        let started = tokio::time::Instant::now();
        assert!(queue.ready(3, linger).await);
        assert_eq!(started.elapsed(), Duration::ZERO);

        let mut batch = Vec::new();
        assert_eq!(queue.take(2, &mut batch), 2);
        assert_eq!(batch, [1, 2]);
        assert_eq!(queue.len(), 1);

        // Pushed from another task while the first waits.
        let (q, mut batch) = (queue.clone(), Vec::new());
        q.take(10, &mut batch);
        let pusher = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            q.push(4);
        });
        assert!(queue.ready(1, Duration::ZERO).await);
        pusher.await.unwrap();
        queue.close();
        assert!(queue.ready(1, linger).await, "closed, but one still waits");
        queue.take(10, &mut batch);
        assert_eq!(batch, [3, 4]);
        assert!(!queue.ready(1, linger).await, "closed and empty");
    }

    #[test]
    fn the_retry_pause_doubles_up_to_its_ceiling_and_resets() {
        let mut pause = RetryPause::new();
        let pauses: Vec<_> = (0..12).map(|_| pause.failed()).collect();
        assert_eq!(pauses[0], RetryPause::MIN);
        assert_eq!(pauses[1], RetryPause::MIN * 2);
        assert_eq!(pauses[11], RetryPause::MAX);
        assert_eq!(pause.peek(), RetryPause::MAX);
        pause.reset();
        assert_eq!(pause.peek(), RetryPause::MIN);
    }
}
