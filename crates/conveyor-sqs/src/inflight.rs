//! Every message received and not yet finished with: its receipt handle, how long SQS
//! keeps it hidden, and, once settled, the settlement still to be carried out.
//!
//! An entry stays here until the keeper has made its settlement's call, so a settlement
//! not yet sent still counts against the pump's room: a keeper that cannot reach SQS stops
//! the pump from receiving more, and what waits for it is bounded.

use std::sync::Mutex;
use std::time::Duration;

use conveyor::kit::{SettleQueue, TagTable};
use conveyor::{Bytes, Headers, PartitionKey};

use crate::data_types::AttributeTypes;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What a settlement asks of SQS.
#[derive(Debug)]
pub(crate) enum Op {
    /// `DeleteMessageBatch`.
    Delete,
    /// `ChangeMessageVisibilityBatch` hiding it for `delay` (zero: visible again now),
    /// rounded up to whole seconds and capped at 12 h from receipt when the call is made.
    Hide { delay: Duration },
    /// Send to the dead-letter queue, then delete.
    Reject(Box<Rejected>),
}

/// A rejected message, kept until it is in the dead-letter queue.
#[derive(Debug)]
pub(crate) struct Rejected {
    pub(crate) reason: String,
    /// The attempt that ended in the rejection.
    pub(crate) attempt: u32,
    pub(crate) payload: Bytes,
    pub(crate) headers: Headers,
    /// The types its attributes came with, where their values alone would not say them.
    pub(crate) types: AttributeTypes,
    pub(crate) partition_key: Option<PartitionKey>,
}

/// Where an entry is in its life.
#[derive(Debug)]
enum State {
    /// Received, not settled: the keeper keeps it hidden.
    Held,
    /// Settled; the keeper has not taken its settlement yet.
    Settled(Op),
    /// The keeper has taken its settlement, and makes its call once the calls before it
    /// (a dead-letter send) are over.
    Taken,
    /// The keeper is making its settlement's call.
    Settling,
}

/// One message received and not finished with.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) receipt: String,
    /// SQS's message id: a FIFO dead-letter queue deduplicates by it.
    pub(crate) message_id: Option<String>,
    /// The types of its attributes, for a dead-lettered or redriven copy.
    pub(crate) types: AttributeTypes,
    pub(crate) received_at: Instant,
    pub(crate) visible_at: Instant,
    state: State,
    /// A renewal's call that covers it is under way: its settlement's call waits for it.
    renewing: bool,
    /// SQS refused its receipt handle (the message was handed out again, or is gone):
    /// renewing it again would fail again.
    receipt_stale: bool,
}

impl Entry {
    /// Whether the keeper keeps it hidden: while it is held, and once settled, until the
    /// keeper makes its settlement's call (which may wait behind a slow one), so that it
    /// does not show again before that call.
    fn renewable(&self) -> bool {
        matches!(self.state, State::Held | State::Settled(_) | State::Taken) && !self.receipt_stale
    }
}

/// A settlement taken by the keeper, to carry out.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) tag: u64,
    pub(crate) receipt: String,
    pub(crate) message_id: Option<String>,
    /// When the receive's answer came, for the 12 h cap of a retry-after.
    pub(crate) received_at: Instant,
    pub(crate) op: Op,
}

/// The messages of one subscription, shared by its pump (which adds them), its
/// deliveries' settler (which settles them) and its keeper (which renews and finishes
/// them).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    entries: Mutex<TagTable<Entry>>,
    /// Tags of settled entries, in the order they were settled, for the keeper.
    pub(crate) settled: SettleQueue<u64>,
    /// Wakes the pump when messages are finished with, making room.
    pub(crate) room: Notify,
    /// Wakes the keeper's settlements when a renewal's call has returned.
    renewal_ended: Notify,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, TagTable<Entry>> {
        conveyor::kit::lock(&self.entries)
    }

    /// Records a message hidden for `visibility` from now; returns its delivery tag.
    pub(crate) fn insert(
        &self,
        receipt: String,
        message_id: Option<String>,
        types: AttributeTypes,
        visibility: Duration,
    ) -> u64 {
        let now = Instant::now();
        self.lock().insert(Entry {
            receipt,
            message_id,
            types,
            received_at: now,
            visible_at: now + visibility,
            state: State::Held,
            renewing: false,
            receipt_stale: false,
        })
    }

    /// Settles `tag` with the op `make` chooses for it. Returns `false` (and does
    /// nothing) if `tag` is unknown or already settled.
    pub(crate) fn settle(&self, tag: u64, make: impl FnOnce(&Entry) -> Op) -> bool {
        {
            let mut entries = self.lock();
            let Some(entry) = entries.get_mut(tag) else {
                return false;
            };
            if !matches!(entry.state, State::Held) {
                return false;
            }
            entry.state = State::Settled(make(entry));
        }
        self.settled.push(tag);
        true
    }

    /// Takes up to `max` settlements waiting for the keeper, oldest first. Their entries
    /// stay (and count) until [`finish`](Self::finish), and are renewed until
    /// [`sending`](Self::sending).
    pub(crate) fn take_settled(&self, max: usize) -> Vec<Pending> {
        let mut tags = Vec::new();
        self.settled.take(max, &mut tags);
        let mut entries = self.lock();
        tags.into_iter()
            .filter_map(|tag| {
                let entry = entries.get_mut(tag)?;
                match std::mem::replace(&mut entry.state, State::Taken) {
                    State::Settled(op) => Some(Pending {
                        tag,
                        receipt: entry.receipt.clone(),
                        message_id: entry.message_id.take(),
                        received_at: entry.received_at,
                        op,
                    }),
                    other => {
                        entry.state = other;
                        None
                    }
                }
            })
            .collect()
    }

    /// The keeper is about to make the settlement calls of `tags` (taken): they are no
    /// longer renewed, so that no renewal lands after a call that sets their visibility.
    /// Their calls then wait for [`renewals_over`](Self::renewals_over).
    pub(crate) fn sending(&self, tags: &[u64]) {
        let mut entries = self.lock();
        for tag in tags {
            if let Some(entry) = entries.get_mut(*tag)
                && matches!(entry.state, State::Taken)
            {
                entry.state = State::Settling;
            }
        }
    }

    /// The attribute types of the message `tag`, while it is not finished with.
    pub(crate) fn types(&self, tag: u64) -> Option<AttributeTypes> {
        self.lock().get(tag).map(|entry| entry.types.clone())
    }

    /// Forgets messages whose settlement was carried out (or given up on).
    pub(crate) fn finish(&self, tags: impl IntoIterator<Item = u64>) {
        {
            let mut entries = self.lock();
            for tag in tags {
                entries.remove(tag);
            }
        }
        self.room.notify_waiters();
    }

    /// Messages received and not finished with: held, or settled with the call not made.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The messages of `due` the keeper still keeps hidden, marked as being renewed until
    /// [`renewal_over`](Self::renewal_over): a settlement of one of them waits for that
    /// ([`renewals_over`](Self::renewals_over)), so that its call lands after the
    /// renewal's and the visibility it sets has the last word.
    pub(crate) fn claim_for_renewal<'a>(
        &self,
        due: &'a [(u64, String, Duration)],
    ) -> Vec<&'a (u64, String, Duration)> {
        let mut entries = self.lock();
        due.iter()
            .filter(|(tag, _, _)| {
                entries.get_mut(*tag).is_some_and(|entry| {
                    let renewable = entry.renewable();
                    entry.renewing |= renewable;
                    renewable
                })
            })
            .collect()
    }

    /// The renewal's call covering `tags` has returned.
    pub(crate) fn renewal_over(&self, tags: impl IntoIterator<Item = u64>) {
        {
            let mut entries = self.lock();
            for tag in tags {
                if let Some(entry) = entries.get_mut(tag) {
                    entry.renewing = false;
                }
            }
        }
        self.renewal_ended.notify_waiters();
    }

    /// Resolves once no renewal's call under way covers any of `tags`.
    pub(crate) async fn renewals_over(&self, tags: &[u64]) {
        loop {
            let ended = self.renewal_ended.notified();
            tokio::pin!(ended);
            // Registered before the check, so an end that comes between the two wakes it.
            ended.as_mut().enable();
            let renewing = {
                let entries = self.lock();
                tags.iter()
                    .any(|tag| entries.get(*tag).is_some_and(|entry| entry.renewing))
            };
            if !renewing {
                return;
            }
            ended.await;
        }
    }

    /// Messages the keeper keeps hidden (held, or settled and not yet taken) that become
    /// visible within `margin`, with the timeout to renew each to: `visibility`, cut so
    /// that no message stays hidden past `cap` from its receipt, in whole seconds (rounded
    /// down). One already hidden up to the cap (within the second a renewal rounds off)
    /// is left out: renewing it again changes nothing.
    pub(crate) fn due(
        &self,
        margin: Duration,
        visibility: Duration,
        cap: Duration,
    ) -> Vec<(u64, String, Duration)> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|(_, entry)| entry.renewable())
            .filter(|(_, entry)| entry.visible_at <= now + margin)
            .filter_map(|(tag, entry)| {
                let hidden_for = entry.visible_at.checked_duration_since(entry.received_at);
                let capped = cap.saturating_sub(Duration::from_secs(1));
                if hidden_for.is_some_and(|hidden_for| hidden_for > capped) {
                    return None;
                }
                let left = cap.checked_sub(now - entry.received_at)?;
                // Whole seconds, as SQS hides a message: the renewal sent and the
                // visibility recorded of it are then the same.
                let renew = Duration::from_secs(visibility.min(left).as_secs());
                (renew >= Duration::from_secs(1)).then(|| (tag, entry.receipt.clone(), renew))
            })
            .collect()
    }

    /// SQS refused `tag`'s receipt handle for a renewal: it is not renewed again.
    pub(crate) fn receipt_stale(&self, tag: u64) {
        if let Some(entry) = self.lock().get_mut(tag) {
            entry.receipt_stale = true;
        }
    }

    /// Notes that `tag` is now hidden until `until` (if the keeper still keeps it hidden).
    pub(crate) fn renewed(&self, tag: u64, until: Instant) {
        if let Some(entry) = self.lock().get_mut(tag)
            && entry.renewable()
        {
            entry.visible_at = until;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    /// What is due with a 30 s visibility, renewed within 15 s of showing, up to 12 h.
    /// A message received now with the receipt `receipt`, hidden for 30 s.
    fn receive(in_flight: &InFlight, receipt: &str) -> u64 {
        in_flight.insert(
            receipt.into(),
            None,
            AttributeTypes::new(),
            Duration::from_secs(30),
        )
    }

    fn due_now(in_flight: &InFlight) -> Vec<(u64, String, Duration)> {
        in_flight.due(Duration::from_secs(15), Duration::from_secs(30), 12 * HOUR)
    }

    #[tokio::test(start_paused = true)]
    async fn only_messages_close_to_visible_are_renewed() {
        let in_flight = InFlight::default();
        let tag = receive(&in_flight, "r");
        assert!(due_now(&in_flight).is_empty());
        tokio::time::advance(Duration::from_secs(16)).await;
        let due = due_now(&in_flight);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(30))]);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_never_reach_past_twelve_hours_from_receipt() {
        let in_flight = InFlight::default();
        let tag = receive(&in_flight, "r");
        tokio::time::advance(12 * HOUR - Duration::from_secs(10)).await;
        let due = due_now(&in_flight);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(10))]);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(due_now(&in_flight).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_cut_at_twelve_hours_is_whole_seconds() {
        let in_flight = InFlight::default();
        let tag = receive(&in_flight, "r");
        tokio::time::advance(12 * HOUR - Duration::from_millis(10_500)).await;
        let due = due_now(&in_flight);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(10))]);
    }

    /// A message renewed up to the cap is not renewed again: renewed at a whole second
    /// from its receipt, or at an odd instant, as on a real clock, which leaves it hidden
    /// to a fraction of a second short of the cap (a renewal is whole seconds, rounded
    /// down).
    #[tokio::test(start_paused = true)]
    async fn a_message_hidden_up_to_twelve_hours_is_not_renewed_again() {
        for left in [Duration::from_secs(10), Duration::from_millis(10_500)] {
            let in_flight = InFlight::default();
            let tag = receive(&in_flight, "r");
            tokio::time::advance(12 * HOUR - left).await;
            let due = due_now(&in_flight);
            assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(10))]);
            in_flight.renewed(tag, Instant::now() + Duration::from_secs(10));
            tokio::time::advance(Duration::from_secs(5)).await;
            assert!(
                due_now(&in_flight).is_empty(),
                "{left:?}: {:?}",
                due_now(&in_flight)
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_message_is_renewed_until_the_keeper_sends_its_call() {
        let in_flight = InFlight::default();
        let tag = receive(&in_flight, "r");
        assert!(in_flight.settle(tag, |_| Op::Hide {
            delay: Duration::ZERO,
        }));
        tokio::time::advance(Duration::from_secs(20)).await;
        let due = due_now(&in_flight);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(30))]);

        // Taken, its call waiting behind another (a dead-letter send): still renewed.
        assert_eq!(in_flight.take_settled(usize::MAX).len(), 1);
        assert_eq!(due_now(&in_flight), due);
        in_flight.sending(&[tag]);
        assert!(due_now(&in_flight).is_empty());
        assert!(in_flight.claim_for_renewal(&due).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_settlement_waits_for_a_renewal_that_covers_its_message_and_no_other() {
        let in_flight = InFlight::default();
        let renewing = receive(&in_flight, "r");
        let other = receive(&in_flight, "o");
        let due = [(renewing, "r".to_string(), Duration::from_secs(30))];
        assert_eq!(in_flight.claim_for_renewal(&due).len(), 1);

        tokio::time::timeout(Duration::from_secs(1), in_flight.renewals_over(&[other]))
            .await
            .expect("no renewal covers it");
        let both = [other, renewing];
        let waiting = in_flight.renewals_over(&both);
        tokio::pin!(waiting);
        tokio::select! {
            biased;
            () = &mut waiting => panic!("its renewal is under way"),
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        in_flight.renewal_over([renewing]);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("its renewal is over");
    }

    #[test]
    fn a_settled_message_counts_until_its_call_is_made() {
        let in_flight = InFlight::default();
        let tag = in_flight.insert(
            "r".into(),
            Some("m".into()),
            AttributeTypes::new(),
            Duration::from_secs(30),
        );
        assert!(in_flight.settle(tag, |_| Op::Delete));
        assert!(
            !in_flight.settle(tag, |_| Op::Hide {
                delay: Duration::ZERO,
            }),
            "settled once only"
        );
        assert_eq!((in_flight.len(), in_flight.settled.len()), (1, 1));
        let taken = in_flight.take_settled(usize::MAX);
        assert_eq!(taken.len(), 1);
        assert_eq!(
            (taken[0].receipt.as_str(), taken[0].message_id.as_deref()),
            ("r", Some("m"))
        );
        assert!(matches!(taken[0].op, Op::Delete));
        assert_eq!(
            (in_flight.len(), in_flight.settled.len()),
            (1, 0),
            "still counted while its call is made"
        );
        in_flight.finish([tag]);
        assert!(in_flight.is_empty());
        assert!(
            !in_flight.settle(tag, |_| Op::Delete),
            "unknown once finished"
        );
    }
}
