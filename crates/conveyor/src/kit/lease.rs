//! The messages a pulling subscription holds: each under a lease the broker lets lapse
//! unless it is renewed (SQS's visibility timeout, JetStream's ack wait, a Redis pending
//! entry's idle time), and, once settled, the settlement still to be carried out.
//!
//! A lease stays in the table until its settlement's call is made. It holds a place in
//! the pump's room until the keeper takes its settlement: the keeper takes a bounded
//! number of batches at once, so a keeper that cannot reach the broker stops the pump
//! from receiving more, and what waits for it is bounded; a keeper that can makes its
//! call while the pump receives the next messages, as a hand-written loop pipelines its
//! ack with its next read.
//!
//! Renewals and settlements are ordered where it matters: a lease whose settlement's call
//! is going out is no longer renewed ([`Leases::sending`]), and that call waits for a
//! renewal under way that covers it ([`Leases::renewals_over`]). So the visibility a
//! settlement sets has the last word; a renewal never lands after it.
//!
//! While the pump waits for room, the keeper does not linger once the settlements waiting
//! would make that room: held back to share a call, they would hold the next receive back
//! with them ([`Leases::room_wanted`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::settle::{SettleQueue, TagTable};
use super::sync::{lock, wait_for};
use super::verdict::Verdict;

/// Where a lease is in its life.
#[derive(Debug)]
enum State {
    /// Received, not settled: the keeper renews it.
    Held,
    /// Settled; the keeper has not taken its settlement yet.
    Settled(Verdict),
    /// The keeper has taken its settlement and makes its call once the work before it
    /// (a dead letter's send, say) is over.
    Taken,
    /// The keeper is making its settlement's call.
    Settling,
}

/// One message held: what the transport keeps of it (`data`), and its lease.
#[derive(Debug)]
struct Entry<D> {
    data: D,
    times: LeaseTimes,
    state: State,
    /// A renewal's call that covers it is under way: its settlement's call waits for it.
    renewing: bool,
    /// The broker refused to renew it (it was handed out again, or is gone): renewing it
    /// again would fail again.
    lost: bool,
}

impl<D> Entry<D> {
    /// Whether the keeper renews it: while it is held, and once settled until the keeper
    /// makes its settlement's call (which may wait behind a slow one), so that it does not
    /// show again before that call.
    fn renewable(&self) -> bool {
        matches!(self.state, State::Held | State::Settled(_) | State::Taken) && !self.lost
    }
}

/// When a lease began and when it lapses unless renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimes {
    /// When the receive's answer came.
    pub received_at: Instant,
    /// When the broker hands the message out again unless the lease is renewed.
    pub expires_at: Instant,
}

/// A settlement the keeper took, to carry out.
#[derive(Debug)]
pub struct Taken<T> {
    /// The delivery's tag.
    pub tag: u64,
    /// What [`Leases::take_settled`] drew from the message's data.
    pub data: T,
    /// When the receive's answer came (SQS caps a delay at 12 hours from there).
    pub received_at: Instant,
    /// What the settlement asks of the broker.
    pub verdict: Verdict,
}

/// The messages one subscription holds, shared by its pump (which adds them), its
/// deliveries' settler (which settles them) and its keeper (which renews and finishes
/// them). `D` is what the transport keeps of each (a receipt handle, a stream entry id).
///
/// ```
/// use std::time::Duration;
/// use conveyor::kit::{Leases, Verdict};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let leases: Leases<&str> = Leases::default();
/// let tag = leases.insert("receipt-1", Duration::from_secs(30));
/// assert!(leases.settle(tag, Verdict::Ack));
/// let taken = leases.take_settled(10, |receipt| *receipt);
/// assert_eq!(taken[0].data, "receipt-1");
/// assert!(matches!(taken[0].verdict, Verdict::Ack));
/// assert_eq!(leases.len(), 1); // counted until its call is made
/// leases.finish([tag]);
/// assert!(leases.is_empty());
/// # }
/// ```
#[derive(Debug)]
pub struct Leases<D> {
    entries: Mutex<TagTable<Entry<D>>>,
    /// Tags of settled leases, in the order they were settled, for the keeper.
    settled: SettleQueue<u64>,
    /// Wakes the pump when messages are finished with, making room.
    room: Notify,
    /// Wakes the keeper's settlements when a renewal's call has returned.
    renewal_ended: Notify,
    /// The limit the pump waits to be under, while it waits.
    room_wanted: watch::Sender<Option<usize>>,
    /// How many entries the keeper has taken (their calls prepared or under way); changed
    /// under the lock of `entries`.
    taken: AtomicUsize,
}

impl<D> Default for Leases<D> {
    fn default() -> Self {
        Leases {
            entries: Mutex::new(TagTable::new()),
            settled: SettleQueue::new(),
            room: Notify::new(),
            renewal_ended: Notify::new(),
            room_wanted: watch::Sender::new(None),
            taken: AtomicUsize::new(0),
        }
    }
}

impl<D> Leases<D> {
    fn lock(&self) -> std::sync::MutexGuard<'_, TagTable<Entry<D>>> {
        lock(&self.entries)
    }

    /// Records a message leased for `lease` from now; returns its delivery tag.
    pub fn insert(&self, data: D, lease: Duration) -> u64 {
        let now = Instant::now();
        self.lock().insert(Entry {
            data,
            times: LeaseTimes {
                received_at: now,
                expires_at: now + lease,
            },
            state: State::Held,
            renewing: false,
            lost: false,
        })
    }

    /// Settles `tag` with `verdict`. Returns `false` (and does nothing) if `tag` is
    /// unknown or already settled.
    pub fn settle(&self, tag: u64, verdict: Verdict) -> bool {
        {
            let mut entries = self.lock();
            let Some(entry) = entries.get_mut(tag) else {
                return false;
            };
            if !matches!(entry.state, State::Held) {
                return false;
            }
            entry.state = State::Settled(verdict);
        }
        self.settled.push(tag);
        true
    }

    /// The settlements waiting for the keeper, in the order they were made.
    pub fn settled(&self) -> &SettleQueue<u64> {
        &self.settled
    }

    /// Takes up to `max` settlements waiting for the keeper, oldest first, each with what
    /// `draw` takes from its message's data. Their leases stay until
    /// [`finish`](Self::finish), and are renewed until [`sending`](Self::sending); they
    /// leave the pump's room now ([`holding`](Self::holding)).
    pub fn take_settled<T>(&self, max: usize, mut draw: impl FnMut(&mut D) -> T) -> Vec<Taken<T>> {
        let mut tags = Vec::new();
        self.settled.take(max, &mut tags);
        let taken: Vec<Taken<T>> = {
            let mut entries = self.lock();
            let taken: Vec<Taken<T>> = tags
                .into_iter()
                .filter_map(|tag| {
                    let entry = entries.get_mut(tag)?;
                    match std::mem::replace(&mut entry.state, State::Taken) {
                        State::Settled(verdict) => Some(Taken {
                            tag,
                            data: draw(&mut entry.data),
                            received_at: entry.times.received_at,
                            verdict,
                        }),
                        other => {
                            entry.state = other;
                            None
                        }
                    }
                })
                .collect();
            self.taken.fetch_add(taken.len(), Ordering::Relaxed);
            taken
        };
        if !taken.is_empty() {
            self.room.notify_waiters();
        }
        taken
    }

    /// The keeper is about to make the settlement calls of `tags` (taken): they are no
    /// longer renewed, so that no renewal lands after a call that sets their visibility.
    /// Their calls then wait for [`renewals_over`](Self::renewals_over).
    pub fn sending(&self, tags: &[u64]) {
        let mut entries = self.lock();
        for tag in tags {
            if let Some(entry) = entries.get_mut(*tag)
                && matches!(entry.state, State::Taken)
            {
                entry.state = State::Settling;
            }
        }
    }

    /// What `look` reads of the data of `tag`, while it is held.
    pub fn with<R>(&self, tag: u64, look: impl FnOnce(&D) -> R) -> Option<R> {
        self.lock().get(tag).map(|entry| look(&entry.data))
    }

    /// Forgets messages whose settlement was carried out (or given up on).
    pub fn finish(&self, tags: impl IntoIterator<Item = u64>) {
        {
            let mut entries = self.lock();
            for tag in tags {
                if let Some(entry) = entries.remove(tag)
                    && matches!(entry.state, State::Taken | State::Settling)
                {
                    self.taken.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        // One finished before the keeper took it made room too.
        self.room.notify_waiters();
    }

    /// Messages held: not settled, or settled with the call not made.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Messages that take room from the pump: not settled, or settled with the keeper
    /// yet to take the settlement.
    pub fn holding(&self) -> usize {
        let entries = self.lock();
        entries
            .len()
            .saturating_sub(self.taken.load(Ordering::Relaxed))
    }

    /// Whether no message is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once fewer than `limit` messages take room ([`holding`](Self::holding)).
    /// While it waits, [`room_wanted`](Self::room_wanted) says so.
    pub async fn room_for(&self, limit: usize) {
        if self.holding() < limit {
            return;
        }
        // Cleared however the wait ends, cancelled included.
        let _wanting = RoomWanted::announce(&self.room_wanted, limit);
        wait_for(&self.room, || (self.holding() < limit).then_some(())).await;
    }

    /// The limit the pump waits in [`room_for`](Self::room_for) to be under, while it
    /// waits, as it changes. The keeper does not linger once the settlements waiting would
    /// make that room: held back to share a call, they would hold the next receive back
    /// too (with one message held at a time, every receive).
    pub fn room_wanted(&self) -> watch::Receiver<Option<usize>> {
        self.room_wanted.subscribe()
    }

    /// The leases the keeper renews that lapse within `margin`, each as `renewal` makes
    /// it ready for the renewal call (`None`: left out, say one renewed as far as the
    /// broker allows).
    pub fn due<T>(
        &self,
        margin: Duration,
        mut renewal: impl FnMut(u64, &D, LeaseTimes) -> Option<T>,
    ) -> Vec<T> {
        let soon = Instant::now() + margin;
        self.lock()
            .iter()
            .filter(|(_, entry)| entry.renewable() && entry.times.expires_at <= soon)
            .filter_map(|(tag, entry)| renewal(tag, &entry.data, entry.times))
            .collect()
    }

    /// The renewals of `due` (each under the tag `tag_of` gives) whose leases the keeper
    /// still renews, marked as being renewed until [`renewal_over`](Self::renewal_over): a
    /// settlement of one of them waits for that ([`renewals_over`](Self::renewals_over)),
    /// so that its call lands after the renewal's.
    pub fn claim_for_renewal<'a, T>(&self, due: &'a [T], tag_of: impl Fn(&T) -> u64) -> Vec<&'a T> {
        let mut entries = self.lock();
        due.iter()
            .filter(|renewal| {
                entries.get_mut(tag_of(renewal)).is_some_and(|entry| {
                    let renewable = entry.renewable();
                    entry.renewing |= renewable;
                    renewable
                })
            })
            .collect()
    }

    /// The renewal's call covering `tags` has returned.
    pub fn renewal_over(&self, tags: impl IntoIterator<Item = u64>) {
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
    pub async fn renewals_over(&self, tags: &[u64]) {
        wait_for(&self.renewal_ended, || {
            let entries = self.lock();
            let renewing = tags
                .iter()
                .any(|tag| entries.get(*tag).is_some_and(|entry| entry.renewing));
            (!renewing).then_some(())
        })
        .await;
    }

    /// The broker refused to renew `tag` (the message was handed out again, or is gone):
    /// it is not renewed again.
    pub fn lost(&self, tag: u64) {
        if let Some(entry) = self.lock().get_mut(tag) {
            entry.lost = true;
        }
    }

    /// Notes that the lease of `tag` now lapses at `until` (if the keeper still renews it).
    pub fn renewed(&self, tag: u64, until: Instant) {
        if let Some(entry) = self.lock().get_mut(tag)
            && entry.renewable()
        {
            entry.times.expires_at = until;
        }
    }
}

/// Marks the pump as waiting for room under a limit for as long as it lives.
struct RoomWanted<'a>(&'a watch::Sender<Option<usize>>);

impl<'a> RoomWanted<'a> {
    fn announce(wanted: &'a watch::Sender<Option<usize>>, limit: usize) -> Self {
        wanted.send_replace(Some(limit));
        RoomWanted(wanted)
    }
}

impl Drop for RoomWanted<'_> {
    fn drop(&mut self) {
        self.0.send_replace(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message received now with the receipt `receipt`, leased for 30 s.
    fn receive(leases: &Leases<String>, receipt: &str) -> u64 {
        leases.insert(receipt.into(), Duration::from_secs(30))
    }

    /// What lapses within 15 s, as (tag, receipt).
    fn due_now(leases: &Leases<String>) -> Vec<(u64, String)> {
        leases.due(Duration::from_secs(15), |tag, receipt, _| {
            Some((tag, receipt.clone()))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn only_leases_close_to_lapsing_are_due() {
        let leases = Leases::default();
        let tag = receive(&leases, "r");
        assert!(due_now(&leases).is_empty());
        tokio::time::advance(Duration::from_secs(16)).await;
        assert_eq!(due_now(&leases), vec![(tag, "r".to_string())]);
        leases.renewed(tag, Instant::now() + Duration::from_secs(30));
        assert!(due_now(&leases).is_empty(), "renewed: not due any more");
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_lease_is_renewed_until_the_keeper_sends_its_call() {
        let leases = Leases::default();
        let tag = receive(&leases, "r");
        assert!(leases.settle(tag, Verdict::Ack));
        tokio::time::advance(Duration::from_secs(20)).await;
        let due = due_now(&leases);
        assert_eq!(due, vec![(tag, "r".to_string())]);

        // Taken, its call waiting behind another (a dead-letter send): still renewed.
        assert_eq!(leases.take_settled(usize::MAX, |_| ()).len(), 1);
        assert_eq!(due_now(&leases), due);
        leases.sending(&[tag]);
        assert!(due_now(&leases).is_empty());
        assert!(leases.claim_for_renewal(&due, |(tag, _)| *tag).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_is_not_renewed_again() {
        let leases = Leases::default();
        let tag = receive(&leases, "r");
        tokio::time::advance(Duration::from_secs(20)).await;
        leases.lost(tag);
        assert!(due_now(&leases).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_settlement_waits_for_a_renewal_that_covers_its_message_and_no_other() {
        let leases = Leases::default();
        let renewing = receive(&leases, "r");
        let other = receive(&leases, "o");
        let due = [renewing];
        assert_eq!(leases.claim_for_renewal(&due, |tag| *tag).len(), 1);

        tokio::time::timeout(Duration::from_secs(1), leases.renewals_over(&[other]))
            .await
            .expect("no renewal covers it");
        let both = [other, renewing];
        let waiting = leases.renewals_over(&both);
        tokio::pin!(waiting);
        tokio::select! {
            biased;
            () = &mut waiting => panic!("its renewal is under way"),
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        leases.renewal_over([renewing]);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("its renewal is over");
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_message_takes_room_until_the_keeper_takes_it_and_is_held_until_its_call_is_made()
     {
        let leases = Leases::default();
        let tag = leases.insert(("r", Some("m")), Duration::from_secs(30));
        assert!(leases.settle(tag, Verdict::Ack));
        assert!(!leases.settle(tag, Verdict::Ack), "settled once only");
        assert_eq!((leases.len(), leases.settled().len()), (1, 1));
        let wanted = leases.room_wanted();
        let room = leases.room_for(1);
        tokio::pin!(room);
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut room)
                .await
                .is_err(),
            "no room while the keeper has not taken its settlement"
        );
        assert_eq!(*wanted.borrow(), Some(1), "the keeper hears the pump waits");
        let taken = leases.take_settled(usize::MAX, |(receipt, id)| (*receipt, id.take()));
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].data, ("r", Some("m")));
        assert!(matches!(taken[0].verdict, Verdict::Ack));
        tokio::time::timeout(Duration::from_secs(1), room)
            .await
            .expect("room once the keeper took it");
        assert_eq!(*wanted.borrow(), None, "not waiting any more");
        assert_eq!(
            (leases.len(), leases.holding(), leases.settled().len()),
            (1, 0, 0),
            "still held while its call is made, out of the pump's way"
        );
        leases.finish([tag]);
        assert!(leases.is_empty());
        assert!(!leases.settle(tag, Verdict::Ack), "unknown once finished");
    }
}
