//! What SQS keeps of each message it holds, in the kit's lease table: the receipt handle
//! (the lease is the visibility timeout), and the message id and attribute types a dead
//! letter needs.

use std::time::Duration;

use conveyor::kit::LeaseTimes;
use tokio::time::Instant;

use crate::data_types::AttributeTypes;

/// One message received and not finished with.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) receipt: String,
    /// SQS's message id: a FIFO dead-letter queue deduplicates by it.
    pub(crate) message_id: Option<String>,
    /// The types of its attributes, for a dead-lettered or redriven copy.
    pub(crate) types: AttributeTypes,
}

/// The timeout to renew a message due to show to: `visibility`, cut so that no message
/// stays hidden past `cap` from its receipt, in whole seconds (rounded down, as SQS hides
/// a message: the renewal sent and the visibility recorded of it are then the same).
/// `None` for one already hidden up to the cap (within the second a renewal rounds off):
/// renewing it again changes nothing.
pub(crate) fn renewal(times: LeaseTimes, visibility: Duration, cap: Duration) -> Option<Duration> {
    let LeaseTimes {
        received_at,
        expires_at,
    } = times;
    let hidden_for = expires_at.checked_duration_since(received_at);
    let capped = cap.saturating_sub(Duration::from_secs(1));
    if hidden_for.is_some_and(|hidden_for| hidden_for > capped) {
        return None;
    }
    let left = cap.checked_sub(Instant::now().saturating_duration_since(received_at))?;
    let renew = Duration::from_secs(visibility.min(left).as_secs());
    (renew >= Duration::from_secs(1)).then_some(renew)
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor::kit::Leases;

    const HOUR: Duration = Duration::from_secs(3600);

    /// A message received now with the receipt `receipt`, hidden for 30 s.
    fn receive(in_flight: &Leases<Held>, receipt: &str) -> u64 {
        let held = Held {
            receipt: receipt.into(),
            message_id: None,
            types: AttributeTypes::new(),
        };
        in_flight.insert(held, Duration::from_secs(30))
    }

    /// What is due with a 30 s visibility, renewed within 15 s of showing, up to 12 h.
    fn due_now(in_flight: &Leases<Held>) -> Vec<(u64, String, Duration)> {
        in_flight.due(Duration::from_secs(15), |tag, held, times| {
            let renew = renewal(times, Duration::from_secs(30), 12 * HOUR)?;
            Some((tag, held.receipt.clone(), renew))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn only_messages_close_to_visible_are_renewed() {
        let in_flight = Leases::<Held>::default();
        let tag = receive(&in_flight, "r");
        assert!(due_now(&in_flight).is_empty());
        tokio::time::advance(Duration::from_secs(16)).await;
        let due = due_now(&in_flight);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(30))]);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_never_reach_past_twelve_hours_from_receipt() {
        let in_flight = Leases::<Held>::default();
        let tag = receive(&in_flight, "r");
        tokio::time::advance(12 * HOUR - Duration::from_secs(10)).await;
        let due = due_now(&in_flight);
        assert_eq!(due, vec![(tag, "r".to_string(), Duration::from_secs(10))]);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(due_now(&in_flight).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_cut_at_twelve_hours_is_whole_seconds() {
        let in_flight = Leases::<Held>::default();
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
            let in_flight = Leases::<Held>::default();
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
}
