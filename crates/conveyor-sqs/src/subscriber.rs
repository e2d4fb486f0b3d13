//! `SqsQueue`, a queue to mount on, and `SqsSubscriber`, its open subscription.

use std::sync::Arc;

use conveyor::{Delivery, Error, Source, SubscribeSettings, Subscriber};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::broker::SqsBroker;
use crate::extender::extend_visibility;
use crate::inflight::InFlight;
use crate::pump::{Handover, Pump};
use crate::settle::{Settler, flush_settlements};

/// An SQS queue to mount a handler on, from [`SqsBroker::queue`].
#[derive(Clone, Debug)]
pub struct SqsQueue {
    broker: SqsBroker,
    name: String,
}

impl SqsQueue {
    pub(crate) fn new(broker: SqsBroker, name: String) -> Self {
        SqsQueue { broker, name }
    }
}

impl Source for SqsQueue {
    type Subscriber = SqsSubscriber;

    fn queue_name(&self) -> &str {
        &self.name
    }

    /// Resolves the queue (it must exist) and starts its pump, visibility extender and
    /// settlement flusher.
    async fn subscribe(self, settings: SubscribeSettings) -> Result<SqsSubscriber, Error> {
        let queue = self
            .broker
            .resolve(&self.name)
            .await
            .map_err(|e| Error::Subscribe {
                queue: self.name.clone(),
                source: Box::new(e),
            })?;
        let client = self.broker.client().clone();
        let broker_settings = self.broker.settings().clone();
        let in_flight = Arc::new(InFlight::default());
        let handover = Arc::new(Handover::default());
        let (ops, queued) = mpsc::unbounded_channel();
        let flusher = tokio::spawn(flush_settlements(
            client.clone(),
            queue.clone(),
            queued,
            broker_settings.flush_interval,
        ));
        let extender = tokio::spawn(extend_visibility(
            client.clone(),
            queue.clone(),
            in_flight.clone(),
            broker_settings.visibility_timeout,
        ));
        let settler = Arc::new(Settler::new(queue.clone(), in_flight.clone(), ops));
        let pump = tokio::spawn(
            Pump {
                client,
                queue,
                settings: broker_settings,
                max_in_flight: settings.max_in_flight,
                batch_size: settings.batch_size,
                handover: handover.clone(),
                in_flight,
                settler,
            }
            .run(),
        );
        Ok(SqsSubscriber {
            handover,
            pump,
            extender,
            flusher: Some(flusher),
        })
    }
}

/// A subscription to an SQS queue: its pump receives, its extender keeps what was
/// received hidden until settled, its flusher makes the settlement calls.
///
/// Closing it stops the pump, releases (visibility 0) every message received but not
/// handed over, and flushes every settlement. Dropping it without closing stops the pump
/// and extender; the flusher still flushes what the dropped deliveries release.
pub struct SqsSubscriber {
    handover: Arc<Handover>,
    pump: JoinHandle<()>,
    extender: JoinHandle<()>,
    flusher: Option<JoinHandle<()>>,
}

impl SqsSubscriber {
    async fn next(&self) -> Delivery {
        loop {
            let arrived = self.handover.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(delivery) = self.handover.take() {
                return delivery;
            }
            arrived.await;
        }
    }
}

impl Subscriber for SqsSubscriber {
    async fn recv(&mut self) -> Option<Result<Delivery, Error>> {
        Some(Ok(self.next().await))
    }

    /// The deliveries of one receive, up to `max`.
    async fn recv_batch(
        &mut self,
        max: usize,
        batch: &mut Vec<Delivery>,
    ) -> Option<Result<(), Error>> {
        batch.push(self.next().await);
        while batch.len() < max {
            match self.handover.take() {
                Some(delivery) => batch.push(delivery),
                None => break,
            }
        }
        Some(Ok(()))
    }

    async fn close(mut self) {
        self.pump.abort();
        let _ = (&mut self.pump).await;
        self.extender.abort();
        self.handover.release_all();
        if let Some(flusher) = self.flusher.take() {
            // The flusher ends once the last settler handle (held by the pump and the
            // deliveries, all gone now) is dropped, after its final flush.
            let _ = flusher.await;
        }
    }
}

impl Drop for SqsSubscriber {
    fn drop(&mut self) {
        self.pump.abort();
        self.extender.abort();
    }
}
