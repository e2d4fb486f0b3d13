//! The visibility extender: keeps every received, unsettled message hidden, whether it is
//! running or still waiting to be handed over, until it is settled.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client;

use crate::inflight::InFlight;
use crate::queue::QueueInfo;
use crate::settle::{BATCH_LIMIT, change_visibility};

/// SQS hides a message for at most 12 hours from its receipt.
pub(crate) const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// Every third of the visibility timeout, renews the messages that would become visible
/// within half of it, ten per `ChangeMessageVisibilityBatch` call. A renewal never
/// reaches past 12 hours from receipt; a message still unsettled then becomes visible.
pub(crate) async fn extend_visibility(
    client: Client,
    queue: Arc<QueueInfo>,
    in_flight: Arc<InFlight>,
    visibility: Duration,
) {
    let tick = (visibility / 3).max(Duration::from_millis(200));
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let due = in_flight.due(visibility / 2, visibility, MAX_VISIBILITY);
        for chunk in due.chunks(BATCH_LIMIT) {
            let entries: Vec<(String, i32)> = chunk
                .iter()
                .map(|(_, receipt, renew)| {
                    (
                        receipt.clone(),
                        i32::try_from(renew.as_secs()).unwrap_or(i32::MAX),
                    )
                })
                .collect();
            let failed = match change_visibility(&client, &queue, &entries).await {
                Ok(failed) => failed,
                Err(error) => {
                    tracing::warn!(queue = queue.name, %error, "cannot renew visibility; trying again next tick");
                    continue;
                }
            };
            for (index, (tag, _, renew)) in chunk.iter().enumerate() {
                match failed.iter().find(|(i, _)| *i == index) {
                    // Settled meanwhile (its receipt is gone) or refused: it stays as is.
                    Some((_, reason)) => {
                        tracing::debug!(queue = queue.name, reason, "visibility not renewed")
                    }
                    None => in_flight.renewed(*tag, *renew),
                }
            }
        }
    }
}
