//! Every message received and not yet settled: its receipt handle and how long SQS keeps
//! it hidden.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// One unsettled message.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) receipt: String,
    pub(crate) received_at: Instant,
    pub(crate) visible_at: Instant,
}

/// The unsettled messages of one subscription, shared by its pump (which adds them), its
/// deliveries' settler (which removes them) and its visibility extender (which renews
/// them).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    entries: Mutex<HashMap<u64, Entry>>,
    next_tag: AtomicU64,
    /// Notified whenever a message is settled.
    pub(crate) settled: Notify,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a message hidden for `visibility` from now; returns its delivery tag.
    pub(crate) fn insert(&self, receipt: String, visibility: Duration) -> u64 {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        self.lock().insert(
            tag,
            Entry {
                receipt,
                received_at: now,
                visible_at: now + visibility,
            },
        );
        tag
    }

    /// Forgets a settled message.
    pub(crate) fn remove(&self, tag: u64) -> Option<Entry> {
        let entry = self.lock().remove(&tag);
        self.settled.notify_waiters();
        entry
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Messages that become visible within `margin`, with the timeout to renew each to:
    /// `visibility`, cut so that no message stays hidden past `cap` from its receipt.
    pub(crate) fn due(
        &self,
        margin: Duration,
        visibility: Duration,
        cap: Duration,
    ) -> Vec<(u64, String, Duration)> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|(_, entry)| entry.visible_at <= now + margin)
            .filter_map(|(tag, entry)| {
                let left = cap.checked_sub(now - entry.received_at)?;
                let renew = visibility.min(left);
                (renew >= Duration::from_secs(1)).then(|| (*tag, entry.receipt.clone(), renew))
            })
            .collect()
    }

    /// Notes that `tag` is now hidden until `renew` from now (if it is still unsettled).
    pub(crate) fn renewed(&self, tag: u64, renew: Duration) {
        if let Some(entry) = self.lock().get_mut(&tag) {
            entry.visible_at = Instant::now() + renew;
        }
    }
}
