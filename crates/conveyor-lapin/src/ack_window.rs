//! Which acks of a subscription's channel may go as one `basic.ack` with `multiple`.
//!
//! A `multiple` ack of tag `T` acks every delivery of the channel up to `T` that is still
//! unacked. So it may stand for a batch's acks only when every delivery below `T` is
//! either one of them or already settled on the wire: one still in a handler, waiting
//! for a republish's confirm, or whose own ack or nack lapin has not written yet would be
//! acked with it (and a later frame of its own would then close the channel with
//! "unknown delivery tag"). [`AckWindow`] keeps the tags that are not settled on the wire,
//! which the prefetch window bounds: every one of them is unacked at the broker.
//!
//! Delivery tags count up from one per channel, and one channel carries one consumer, so
//! the tags a subscription receives are consecutive. When they are not (lapin recovered
//! the channel and the tags start again), the subscriber starts a new [`Epoch`]; the
//! settlements of an older one are never coalesced.

use std::collections::BTreeSet;

/// A run of consecutive delivery tags on one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch {
    /// Counts the runs of one subscription.
    pub(crate) number: u64,
    /// The run's first tag.
    pub(crate) first: u64,
}

/// Where a delivery sits on its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) epoch: Epoch,
    pub(crate) tag: u64,
}

/// Gives each received delivery its [`Place`], starting an epoch where the tags stop
/// being consecutive.
#[derive(Debug, Default)]
pub(crate) struct Places {
    epoch: Option<Epoch>,
    last: u64,
}

impl Places {
    /// The place of the delivery received next, with tag `tag`.
    pub(crate) fn next(&mut self, tag: u64) -> Place {
        let epoch = match self.epoch {
            Some(epoch) if self.last.checked_add(1) == Some(tag) => epoch,
            current => {
                let number = current.map_or(0, |epoch| epoch.number.wrapping_add(1));
                let epoch = Epoch { number, first: tag };
                self.epoch = Some(epoch);
                epoch
            }
        };
        self.last = tag;
        Place { epoch, tag }
    }
}

/// The current epoch's tags that are not settled on the wire. Kept by the settle task:
/// [`seen`](Self::seen) as each settlement reaches it, [`written`](Self::written) once its
/// frame is written (or its republish has ended).
#[derive(Debug, Default)]
pub(crate) struct AckWindow {
    epoch: Option<Epoch>,
    /// The highest tag of the epoch a settlement has been seen for.
    highest: u64,
    /// The epoch's tags up to `highest` not settled on the wire yet.
    unsettled: BTreeSet<u64>,
    /// Set when the tags made no sense (a tag seen twice, a jump past any prefetch
    /// window): the epoch is then never coalesced.
    broken: bool,
}

/// More tags than a prefetch window can hold (`basic.qos` takes a 16-bit count): a jump
/// this long means the tags are not what this module assumes.
const MAX_UNSETTLED: u64 = 1 << 17;

impl AckWindow {
    /// A settlement of the delivery at `place` has reached the settle task. The tags of
    /// its epoch between the highest seen so far and it are deliveries still unsettled.
    pub(crate) fn seen(&mut self, place: Place) {
        if self
            .epoch
            .is_some_and(|epoch| place.epoch.number < epoch.number)
        {
            return;
        }
        if self.epoch != Some(place.epoch) {
            *self = AckWindow {
                epoch: Some(place.epoch),
                highest: place.epoch.first.saturating_sub(1),
                ..AckWindow::default()
            };
        }
        if self.broken {
            return;
        }
        if place.tag <= self.highest {
            // Below the highest: it must be one of the gaps left when a later tag came.
            if !self.unsettled.contains(&place.tag) {
                self.break_epoch();
            }
            return;
        }
        if place.tag - self.highest > MAX_UNSETTLED {
            self.break_epoch();
            return;
        }
        self.unsettled.extend(self.highest + 1..=place.tag);
        self.highest = place.tag;
    }

    /// The epoch whose tags are kept: the newest one seen.
    pub(crate) fn epoch(&self) -> Option<Epoch> {
        self.epoch
    }

    /// The settlement at `place` is on the wire (or came to nothing: its channel is gone).
    pub(crate) fn written(&mut self, place: Place) {
        if self.epoch == Some(place.epoch) {
            self.unsettled.remove(&place.tag);
        }
    }

    /// The highest of `acks` (tags of the current epoch, ascending) that one `multiple`
    /// ack may stand for together with all the lower ones, or `None` when fewer than two
    /// of them can go together.
    pub(crate) fn coalescible(&self, epoch: Epoch, acks: &[u64]) -> Option<u64> {
        if self.broken || self.epoch != Some(epoch) {
            return None;
        }
        // The first unsettled tag that is not one of the acks bounds what may go.
        let mut acks_at = 0;
        let mut bound = None;
        for &tag in &self.unsettled {
            while acks_at < acks.len() && acks[acks_at] < tag {
                acks_at += 1;
            }
            if acks.get(acks_at) != Some(&tag) {
                bound = Some(tag);
                break;
            }
        }
        let together = match bound {
            Some(bound) => acks.partition_point(|&tag| tag < bound),
            None => acks.len(),
        };
        let highest = together.checked_sub(1).map(|last| acks[last])?;
        (together >= 2).then_some(highest)
    }

    fn break_epoch(&mut self) {
        tracing::debug!("delivery tags out of sequence; acking one by one on this channel");
        self.broken = true;
        self.unsettled.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(epoch: Epoch, tag: u64) -> Place {
        Place { epoch, tag }
    }

    fn first_epoch() -> Epoch {
        Epoch {
            number: 0,
            first: 1,
        }
    }

    #[test]
    fn consecutive_tags_share_an_epoch_and_a_restart_begins_another() {
        let mut places = Places::default();
        let a = places.next(1);
        let b = places.next(2);
        assert_eq!(a.epoch, b.epoch);
        let restarted = places.next(1);
        assert_ne!(restarted.epoch, a.epoch);
        assert_eq!(restarted.epoch.first, 1);
        assert_eq!(places.next(2).epoch, restarted.epoch);
    }

    #[test]
    fn acks_in_order_with_nothing_unsettled_below_go_together() {
        let epoch = first_epoch();
        let mut window = AckWindow::default();
        for tag in 1..=3 {
            window.seen(place(epoch, tag));
        }
        assert_eq!(window.coalescible(epoch, &[1, 2, 3]), Some(3));
    }

    #[test]
    fn a_delivery_still_unsettled_below_bounds_what_goes_together() {
        let epoch = first_epoch();
        let mut window = AckWindow::default();
        // Tag 3 is in a handler (never seen); 1, 2, 4 and 5 are acked.
        for tag in [1, 2, 4, 5] {
            window.seen(place(epoch, tag));
        }
        assert_eq!(window.coalescible(epoch, &[1, 2, 4, 5]), Some(2));
        // Once 1 and 2 are written and 3 is acked, 3 to 5 go together.
        window.written(place(epoch, 1));
        window.written(place(epoch, 2));
        window.seen(place(epoch, 3));
        assert_eq!(window.coalescible(epoch, &[3, 4, 5]), Some(5));
    }

    #[test]
    fn a_frame_not_written_yet_bounds_the_next_batch() {
        let epoch = first_epoch();
        let mut window = AckWindow::default();
        for tag in 1..=4 {
            window.seen(place(epoch, tag));
        }
        // 1 and 2 are being written (or 2 is a nack, or waits for its confirm).
        assert_eq!(window.coalescible(epoch, &[3, 4]), None);
        window.written(place(epoch, 1));
        window.written(place(epoch, 2));
        assert_eq!(window.coalescible(epoch, &[3, 4]), Some(4));
    }

    #[test]
    fn a_single_ack_or_another_epoch_is_not_coalesced() {
        let epoch = first_epoch();
        let mut window = AckWindow::default();
        window.seen(place(epoch, 1));
        assert_eq!(window.coalescible(epoch, &[1]), None);
        let later = Epoch {
            number: 1,
            first: 1,
        };
        assert_eq!(window.coalescible(later, &[1]), None);
        // A settlement of the older epoch after the new one began changes nothing.
        window.seen(place(later, 1));
        window.seen(place(later, 2));
        window.seen(place(epoch, 5));
        assert_eq!(window.coalescible(later, &[1, 2]), Some(2));
    }

    #[test]
    fn a_tag_seen_twice_stops_coalescing_for_the_epoch() {
        let epoch = first_epoch();
        let mut window = AckWindow::default();
        window.seen(place(epoch, 1));
        window.seen(place(epoch, 2));
        window.written(place(epoch, 1));
        window.seen(place(epoch, 1));
        window.seen(place(epoch, 3));
        assert_eq!(window.coalescible(epoch, &[2, 3]), None);
    }

    #[test]
    fn an_epoch_that_starts_past_one_counts_from_its_first_tag() {
        let epoch = Epoch {
            number: 3,
            first: 41,
        };
        let mut window = AckWindow::default();
        window.seen(place(epoch, 41));
        window.seen(place(epoch, 42));
        assert_eq!(window.coalescible(epoch, &[41, 42]), Some(42));
    }
}
