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

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn only_messages_close_to_visible_are_renewed() {
        let in_flight = InFlight::default();
        let tag = in_flight.insert("r".into(), Duration::from_secs(30));
        assert!(
            in_flight
                .due(Duration::from_secs(15), Duration::from_secs(30), 12 * HOUR)
                .is_empty()
        );
        tokio::time::advance(Duration::from_secs(16)).await;
        let due = in_flight.due(Duration::from_secs(15), Duration::from_secs(30), 12 * HOUR);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(30))]);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_never_reach_past_twelve_hours_from_receipt() {
        let in_flight = InFlight::default();
        let tag = in_flight.insert("r".into(), Duration::from_secs(30));
        tokio::time::advance(12 * HOUR - Duration::from_secs(10)).await;
        let due = in_flight.due(Duration::from_secs(15), Duration::from_secs(30), 12 * HOUR);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(10))]);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(
            in_flight
                .due(Duration::from_secs(15), Duration::from_secs(30), 12 * HOUR)
                .is_empty()
        );
    }

    #[test]
    fn a_settled_message_is_forgotten() {
        let in_flight = InFlight::default();
        let tag = in_flight.insert("r".into(), Duration::from_secs(30));
        assert_eq!(in_flight.len(), 1);
        assert!(in_flight.remove(tag).is_some());
        assert!(in_flight.remove(tag).is_none());
        assert_eq!(in_flight.len(), 0);
    }
}
