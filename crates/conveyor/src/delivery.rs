//! One received message and how it is settled.

use std::any::Any;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use bytes::Bytes;

use crate::headers::Headers;
use crate::message::PartitionKey;
use crate::outcome::Settlement;

/// Settles deliveries on behalf of a transport.
///
/// A transport implements this once per subscription (or queue) and shares it through an
/// `Arc` among its deliveries, each of which carries a `tag` that identifies it to the
/// transport; so making a delivery allocates nothing for settlement.
///
/// `settle` is called exactly once per delivery and must not block: a transport that needs
/// I/O queues the work (an AMQP ack, an SQS `DeleteMessageBatch`) and flushes it itself,
/// at the latest when its subscriber is closed.
pub trait Settle: Send + Sync + 'static {
    /// Settles the delivery [`Settled::tag`] names.
    fn settle(&self, settled: Settled<'_>);

    /// The transport's own record of the unsettled delivery `tag` names, as it received
    /// it, for [`Delivery::transport_record`]: what the core's view leaves out (RabbitMQ's
    /// AMQP properties and typed header values, say). `None` by default.
    fn record(&self, tag: u64) -> Option<Box<dyn Any + Send>> {
        let _ = tag;
        None
    }
}

/// A delivery being settled: what a transport needs to carry out the settlement.
///
/// The delivery gives up its payload and headers here, so a transport that must send the
/// message somewhere (a dead-letter queue with the reason, a copy that counts attempts)
/// keeps no copy of its own while the handler runs.
#[derive(Debug)]
#[non_exhaustive]
pub struct Settled<'a> {
    /// The tag the transport gave the delivery in [`Delivery::new`].
    pub tag: u64,
    /// What to do with the message.
    pub settlement: Settlement<'a>,
    /// Which attempt just ended, counting from 1: the broker's count when it was
    /// received, plus the retries the dispatcher made while holding it (see
    /// [`Delivery::attempt`]). A transport that counts attempts itself carries it on.
    pub attempt: u32,
    /// The payload.
    pub payload: Bytes,
    /// The headers, as received.
    pub headers: Headers,
    /// The partition key, if the message has one.
    pub partition_key: Option<PartitionKey>,
}

impl<'a> Settled<'a> {
    /// A settlement of `tag` with no message contents, attempt 1: for a transport's own
    /// tests.
    pub fn new(tag: u64, settlement: Settlement<'a>) -> Self {
        Settled {
            tag,
            settlement,
            attempt: 1,
            payload: Bytes::new(),
            headers: Headers::new(),
            partition_key: None,
        }
    }
}

/// One received message: payload, headers, partition key, receive count, and the duty to
/// be settled exactly once.
///
/// The dispatcher settles a delivery after its handler has finished, never before. A
/// delivery dropped unsettled (a cancelled handler, a shutdown) is released back to its
/// queue, so nothing is lost.
pub struct Delivery {
    payload: Bytes,
    headers: Headers,
    partition_key: Option<PartitionKey>,
    /// `None` where the broker keeps no count (a count of 0 is taken as none). A
    /// `NonZeroU32`, like `lane`, to keep a delivery small: see the size check below.
    receive_count: Option<NonZeroU32>,
    redelivered: bool,
    /// Retries the dispatcher made while holding the delivery (retries inside a lane).
    retries: u32,
    queue: Arc<str>,
    /// The lane plus one.
    lane: Option<NonZeroU32>,
    settler: Option<(Arc<dyn Settle>, u64)>,
    /// When it was taken in ahead of its handler, by its transport (a read-ahead buffer)
    /// or by any-worker's dispatcher, for the head-of-line wait metric. Unset otherwise
    /// (lanes note it beside the delivery, `telemetry::Arrival`).
    #[cfg(feature = "metrics")]
    arrived: Option<crate::clock::Tick>,
}

// The compiler moves at most 128 bytes inline; a larger value is copied by a call to
// `memcpy` at every move, about a dozen per delivery (330 instructions). A delivery
// waiting on any-worker's board travels with its key (16 bytes) and must stay within it
// too, or taking it off the board costs two such calls. Hence the `NonZeroU32`s above
// and an 8-byte arrival clock.
const _: () = assert!(std::mem::size_of::<Delivery>() <= 120);

impl Delivery {
    /// A delivery of `payload` from `queue`, settled by `settler` under `tag`.
    ///
    /// For transports. The builder methods add what the broker says about the message.
    pub fn new(payload: Bytes, queue: Arc<str>, settler: Arc<dyn Settle>, tag: u64) -> Self {
        Delivery {
            payload,
            headers: Headers::new(),
            partition_key: None,
            receive_count: None,
            redelivered: false,
            retries: 0,
            queue,
            lane: None,
            settler: Some((settler, tag)),
            #[cfg(feature = "metrics")]
            arrived: None,
        }
    }

    /// For transports that take deliveries in before the dispatcher asks for them (a
    /// read-ahead buffer): notes that this one arrived now, so that the head-of-line
    /// wait metric (`conveyor.wait.duration`) counts its time in the buffer. Does
    /// nothing without the `metrics` feature.
    pub fn arrived_now(mut self) -> Self {
        self.note_arrival();
        self
    }

    /// Notes that the delivery arrived now, unless its transport noted it earlier: for
    /// any-worker, which holds a delivery before its handler starts. (Lanes note when
    /// they took one in beside it, `telemetry::Arrival`.)
    pub(crate) fn note_arrival(&mut self) {
        #[cfg(feature = "metrics")]
        if self.arrived.is_none() {
            self.arrived = Some(crate::clock::Tick::now());
        }
    }

    /// When the delivery arrived, if it was taken in ahead of its handler.
    #[cfg(feature = "metrics")]
    #[inline]
    pub(crate) fn arrived(&self) -> Option<crate::clock::Tick> {
        self.arrived
    }

    /// Sets the headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Sets the partition key.
    pub fn with_partition_key(mut self, key: Option<PartitionKey>) -> Self {
        self.partition_key = key;
        self
    }

    /// Sets how many times the broker has handed this message out, this time included
    /// (1 on first delivery; 0 is taken as no count). Also marks the delivery redelivered
    /// when above 1.
    pub fn with_receive_count(mut self, count: u32) -> Self {
        self.receive_count = NonZeroU32::new(count);
        self.redelivered |= count > 1;
        self
    }

    /// Marks the delivery as redelivered, for brokers that only keep a flag.
    pub fn with_redelivered(mut self, redelivered: bool) -> Self {
        self.redelivered = redelivered;
        self
    }

    /// The payload bytes.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The message id, if the publisher gave one (the [`MESSAGE_ID_HEADER`] header).
    ///
    /// [`MESSAGE_ID_HEADER`]: crate::MESSAGE_ID_HEADER
    pub fn message_id(&self) -> Option<&str> {
        self.headers.get_str(crate::message::MESSAGE_ID_HEADER)
    }

    /// The partition key, if the message has one.
    pub fn partition_key(&self) -> Option<&PartitionKey> {
        self.partition_key.as_ref()
    }

    /// How many times the broker has handed this message out, this one included, where
    /// the broker keeps count.
    pub fn receive_count(&self) -> Option<u32> {
        self.receive_count.map(NonZeroU32::get)
    }

    /// Whether the broker handed this message out before.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// Which attempt this is, counting from 1: the receive count where the broker keeps
    /// one (otherwise 2 for a redelivery and 1 for a first delivery), plus the retries the
    /// dispatcher made while holding the delivery.
    pub fn attempt(&self) -> u32 {
        self.receive_count()
            .unwrap_or(if self.redelivered { 2 } else { 1 })
            .saturating_add(self.retries)
    }

    /// Counts one more attempt made without handing the delivery back to the broker.
    pub(crate) fn count_retry(&mut self) {
        self.retries = self.retries.saturating_add(1);
    }

    /// The queue the delivery came from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The queue name, shared (for [`DeliveryInfo`](crate::DeliveryInfo)).
    pub(crate) fn shared_queue(&self) -> &Arc<str> {
        &self.queue
    }

    /// The transport's own record of the message, as a `T`, if the transport keeps one of
    /// that type: an escape hatch to what the portable view leaves out, for code written
    /// for one broker. A transport documents what it gives (`conveyor_lapin::amqp_properties`
    /// reads a RabbitMQ delivery's AMQP properties this way); the in-process transport
    /// gives nothing. Each call makes a copy.
    ///
    /// ```
    /// # fn f(delivery: &conveyor::Delivery) {
    /// // Any other type, or another transport's delivery: `None`.
    /// let record: Option<String> = delivery.transport_record();
    /// # }
    /// ```
    pub fn transport_record<T: Any>(&self) -> Option<T> {
        let (settler, tag) = self.settler.as_ref()?;
        let record = settler.record(*tag)?;
        let record: Box<dyn Any> = record;
        record.downcast::<T>().ok().map(|record| *record)
    }

    /// The lane that runs this delivery, under `workers(n).by_key()` dispatch.
    pub fn lane(&self) -> Option<usize> {
        // At least 1: a `NonZeroU32`.
        self.lane.map(|lane| (lane.get() - 1) as usize)
    }

    pub(crate) fn set_lane(&mut self, lane: usize) {
        // A mount has far fewer lanes than `u32::MAX`; past it the lane goes unnamed.
        self.lane = u32::try_from(lane)
            .ok()
            .and_then(|lane| lane.checked_add(1))
            .and_then(NonZeroU32::new);
    }

    /// Puts `wrap`'s settler in place of the transport's, under the same tag: for a
    /// source made of other sources (`shards::Shards`) that must know when each of its
    /// deliveries is settled. Returns whether it did: a delivery already settled has no
    /// settler left to wrap.
    pub(crate) fn wrap_settler(
        &mut self,
        wrap: impl FnOnce(&Arc<dyn Settle>) -> Arc<dyn Settle>,
    ) -> bool {
        match &mut self.settler {
            Some((settler, _)) => {
                *settler = wrap(settler);
                true
            }
            None => false,
        }
    }

    /// Settles the delivery. Called by the dispatcher once its handler has finished.
    pub fn settle(mut self, settlement: Settlement<'_>) {
        self.settle_now(settlement);
    }

    fn settle_now(&mut self, settlement: Settlement<'_>) {
        if let Some((settler, tag)) = self.settler.take() {
            settler.settle(Settled {
                tag,
                settlement,
                attempt: self.attempt(),
                payload: std::mem::take(&mut self.payload),
                headers: std::mem::take(&mut self.headers),
                partition_key: self.partition_key.take(),
            });
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.settle_now(Settlement::Release);
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.queue)
            .field("partition_key", &self.partition_key)
            .field("receive_count", &self.receive_count)
            .field("redelivered", &self.redelivered)
            .field("headers", &self.headers)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u64, String)>>);

    impl Settle for Recorder {
        fn settle(&self, settled: Settled<'_>) {
            if let Ok(mut seen) = self.0.lock() {
                seen.push((settled.tag, format!("{:?}", settled.settlement)));
            }
        }
    }

    fn delivery(recorder: &Arc<Recorder>, tag: u64) -> Delivery {
        Delivery::new(Bytes::from_static(b"x"), "q".into(), recorder.clone(), tag)
    }

    #[test]
    fn settles_exactly_once() {
        let recorder = Arc::new(Recorder::default());
        delivery(&recorder, 7).settle(Settlement::Ack);
        assert_eq!(*recorder.0.lock().unwrap(), vec![(7, "Ack".to_string())]);
    }

    #[test]
    fn dropped_unsettled_is_released() {
        let recorder = Arc::new(Recorder::default());
        drop(delivery(&recorder, 3));
        assert_eq!(
            *recorder.0.lock().unwrap(),
            vec![(3, "Release".to_string())]
        );
    }

    #[test]
    fn attempt_counts_from_one() {
        let recorder = Arc::new(Recorder::default());
        assert_eq!(delivery(&recorder, 1).attempt(), 1);
        assert_eq!(delivery(&recorder, 2).with_redelivered(true).attempt(), 2);
        assert_eq!(delivery(&recorder, 3).with_receive_count(5).attempt(), 5);
    }

    #[test]
    fn retries_made_while_held_count_as_attempts() {
        let recorder = Arc::new(Recorder::default());
        let mut held = delivery(&recorder, 1).with_receive_count(2);
        held.count_retry();
        assert_eq!(held.attempt(), 3);
    }

    #[test]
    fn a_receive_count_of_zero_is_no_count() {
        let recorder = Arc::new(Recorder::default());
        let delivery = delivery(&recorder, 1).with_receive_count(0);
        assert_eq!(delivery.receive_count(), None);
        assert_eq!(delivery.attempt(), 1);
    }

    #[test]
    fn the_lane_is_the_one_set_from_the_first_to_the_largest() {
        let recorder = Arc::new(Recorder::default());
        let mut held = delivery(&recorder, 1);
        assert_eq!(held.lane(), None);
        for lane in [0, 1, 7, u32::MAX as usize - 1] {
            held.set_lane(lane);
            assert_eq!(held.lane(), Some(lane));
        }
        // Past what a lane number holds: unnamed rather than wrong.
        held.set_lane(u32::MAX as usize);
        assert_eq!(held.lane(), None);
    }
}
