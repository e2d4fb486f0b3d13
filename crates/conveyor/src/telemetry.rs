//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade, so that any exporter
//! works (Prometheus, StatsD, OpenTelemetry...). Built with the `metrics` cargo feature;
//! without it every call here is empty and compiles away.
//!
//! Names and units follow OpenTelemetry's messaging conventions where they have one:
//!
//! | name | kind | what |
//! | --- | --- | --- |
//! | `messaging.client.consumed.messages` | counter | deliveries taken from the queue |
//! | `messaging.process.duration` | histogram, seconds | one run of a handler |
//! | `messaging.client.sent.messages` | counter | messages published (with `error.type` when refused) |
//! | `messaging.client.operation.duration` | histogram, seconds | a broker call, by `messaging.operation.name`: an SQS request by its API name, a RabbitMQ publish until its confirm |
//! | `conveyor.outcomes` | counter, by `conveyor.outcome` | `ack`, `retry`, `retry_after`, `reject`, and `released` (a handler cancelled at the shutdown timeout, its delivery handed back unsettled) |
//! | `conveyor.decode_failures` | counter | payloads or extractors a handler could not take |
//! | `conveyor.panics` | counter | panics caught in decoding, extractors or handlers |
//! | `conveyor.dead_letters` | counter | rejected messages the transport moved to the queue's dead-letter queue, by the queue they came from |
//! | `conveyor.reconnects` | counter | times a mount's receives started failing, and it began retrying |
//! | `conveyor.connection.reconnects` | counter, by `conveyor.connection` | times a broker connection was recovered (RabbitMQ, whose subscriptions wait for the recovery without failing a receive) |
//! | `conveyor.in_flight` | gauge | deliveries a mount's handlers are running |
//! | `conveyor.wait.duration` | histogram, seconds | head-of-line wait: from a delivery's arrival to the start of its handler, for the deliveries that can wait: in a lane, for a free worker under any-worker, or in a transport's read-ahead buffer (SQS). A sequential, `workers(n)` or batch mount starts a delivery as it takes it from the transport, so it records a wait only for what the transport read ahead |
//! | `conveyor.lane.in_flight` | gauge, by `conveyor.lane` | a lanes mount's delivery running in each lane (0 or 1) |
//! | `conveyor.lane.waiting` | gauge, by `conveyor.lane` | deliveries waiting for each lane |
//!
//! Every mount series carries `messaging.system`, `messaging.destination.name` (the
//! queue) and `conveyor.dispatch` (the mount's mode); `messaging.client.sent.messages`
//! carries the system and the destination, `messaging.client.operation.duration` the
//! system and the operation; both add `error.type` for what failed. No label ever holds a partition key or message id: the number
//! of series stays that of the mounts, lanes and destinations. Mount handles are
//! registered once, when a mount starts, and the in-process broker registers a queue's
//! sent counter at its first publish: install the recorder before starting the app or
//! publishing.
//!
//! [`record_sent`], [`record_operation`], [`record_dead_lettered`] and
//! [`record_reconnect`] are for transports.

use crate::clock::Tick;

#[cfg(feature = "metrics")]
mod enabled {
    use super::Tick;
    use crate::outcome::Settlement;
    use metrics::{Counter, Gauge, Histogram, Label};

    /// The handles of one mount's series.
    #[derive(Clone)]
    pub(crate) struct MountMetrics {
        consumed: Counter,
        duration: Histogram,
        acked: Counter,
        retried: Counter,
        retried_later: Counter,
        rejected: Counter,
        released: Counter,
        decode_failures: Counter,
        panics: Counter,
        reconnects: Counter,
        in_flight: Gauge,
        wait: Histogram,
        /// Per lane: (in flight, waiting), for a lanes mount.
        lanes: std::sync::Arc<[(Gauge, Gauge)]>,
    }

    /// One lane's series of a lanes mount, kept by the lane's task: `conveyor.lane.in_flight`
    /// and `conveyor.lane.waiting`.
    pub(crate) struct LaneMetrics(Option<(Gauge, Gauge)>);

    impl LaneMetrics {
        /// The lane starts a delivery: one fewer waits, one runs.
        #[inline]
        pub(crate) fn started(&self) {
            if let Some((running, waiting)) = &self.0 {
                waiting.decrement(1.0);
                running.set(1.0);
            }
        }

        /// The lane has finished its delivery.
        #[inline]
        pub(crate) fn finished(&self) {
            if let Some((running, _)) = &self.0 {
                running.set(0.0);
            }
        }
    }

    /// When lanes' dispatcher took a delivery in, for the head-of-line wait: kept beside
    /// the delivery as it waits in its lane. A transport's own note of the arrival
    /// (`Delivery::arrived_now`) comes first.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Arrival(Option<Tick>);

    impl Arrival {
        /// Taken in now.
        #[inline]
        pub(crate) fn now() -> Self {
            Arrival(Some(Tick::now()))
        }

        /// Not noted beside the delivery: a wait is recorded only if the delivery
        /// itself notes when it arrived.
        #[inline]
        pub(crate) fn none() -> Self {
            Arrival(None)
        }
    }

    impl std::fmt::Debug for MountMetrics {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("MountMetrics")
        }
    }

    impl MountMetrics {
        pub(crate) fn new(
            system: &'static str,
            queue: &str,
            dispatch: &'static str,
            lanes: usize,
        ) -> Self {
            let labels = vec![
                Label::new("messaging.system", system),
                Label::new("messaging.destination.name", queue.to_string()),
                Label::new("conveyor.dispatch", dispatch),
            ];
            let outcome = |kind: &'static str| {
                let mut labels = labels.clone();
                labels.push(Label::new("conveyor.outcome", kind));
                metrics::counter!("conveyor.outcomes", labels)
            };
            // Off the first delivery's path.
            Tick::calibrate();
            MountMetrics {
                consumed: metrics::counter!("messaging.client.consumed.messages", labels.clone()),
                duration: metrics::histogram!("messaging.process.duration", labels.clone()),
                acked: outcome("ack"),
                retried: outcome("retry"),
                retried_later: outcome("retry_after"),
                rejected: outcome("reject"),
                released: outcome("released"),
                decode_failures: metrics::counter!("conveyor.decode_failures", labels.clone()),
                panics: metrics::counter!("conveyor.panics", labels.clone()),
                reconnects: metrics::counter!("conveyor.reconnects", labels.clone()),
                in_flight: metrics::gauge!("conveyor.in_flight", labels.clone()),
                wait: metrics::histogram!("conveyor.wait.duration", labels.clone()),
                lanes: (0..lanes)
                    .map(|lane| {
                        let mut labels = labels.clone();
                        labels.push(Label::new("conveyor.lane", lane.to_string()));
                        (
                            metrics::gauge!("conveyor.lane.in_flight", labels.clone()),
                            metrics::gauge!("conveyor.lane.waiting", labels),
                        )
                    })
                    .collect(),
            }
        }

        /// A delivery starts its first run now: records its wait since it `arrived`,
        /// if it was taken in ahead of its handler, and returns the run's start (one
        /// clock read for both).
        #[inline]
        pub(crate) fn first_run_started(
            &self,
            delivery: &crate::delivery::Delivery,
            arrival: Arrival,
        ) -> Option<Tick> {
            let now = Tick::now();
            // The transport's note first: it took the delivery in earliest.
            if let Some(arrived) = delivery.arrived().or(arrival.0) {
                self.wait.record(now.seconds_since(arrived));
            }
            Some(now)
        }

        /// The series of lane `lane`, for the lane's own task to keep: it then reaches
        /// its gauges without a look-up per delivery.
        pub(crate) fn lane(&self, lane: usize) -> LaneMetrics {
            LaneMetrics(self.lanes.get(lane).cloned())
        }

        pub(crate) fn reconnecting(&self) {
            self.reconnects.increment(1);
        }

        #[inline]
        pub(crate) fn lane_queued(&self, lane: usize) {
            if let Some((_, waiting)) = self.lanes.get(lane) {
                waiting.increment(1.0);
            }
        }

        /// The mount has stopped: what its lanes held went back unstarted.
        pub(crate) fn lanes_stopped(&self) {
            for (running, waiting) in self.lanes.iter() {
                running.set(0.0);
                waiting.set(0.0);
            }
        }

        #[inline]
        pub(crate) fn consumed(&self, count: u64) {
            self.consumed.increment(count);
            // Counts as f64: exact for any count a mount can hold.
            self.in_flight.increment(count as f64);
        }

        #[inline]
        pub(crate) fn finished(&self, count: u64) {
            self.in_flight.decrement(count as f64);
        }

        #[inline]
        pub(crate) fn run_started(&self) -> Option<Tick> {
            Some(Tick::now())
        }

        #[inline]
        pub(crate) fn run_ended(&self, started: Option<Tick>) {
            if let Some(started) = started {
                self.duration.record(started.elapsed_seconds());
            }
        }

        /// Counts what the dispatcher settled. A release is not counted here: the core
        /// releases only by dropping a delivery, counted where it drops it
        /// ([`released`](Self::released)).
        #[inline]
        pub(crate) fn outcome(&self, settlement: &Settlement<'_>) {
            match settlement {
                Settlement::Ack => &self.acked,
                Settlement::Retry => &self.retried,
                Settlement::RetryAfter(_) => &self.retried_later,
                Settlement::Reject { .. } => &self.rejected,
                Settlement::Release => return,
            }
            .increment(1);
        }

        pub(crate) fn released(&self, count: u64) {
            self.released.increment(count);
        }

        pub(crate) fn decode_failed(&self) {
            self.decode_failures.increment(1);
        }

        pub(crate) fn panicked(&self) {
            self.panics.increment(1);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod disabled {
    use super::Tick;
    use crate::outcome::Settlement;

    /// Without the `metrics` feature: nothing, at no cost.
    #[derive(Clone, Debug)]
    pub(crate) struct MountMetrics;

    /// Without the `metrics` feature: nothing.
    pub(crate) struct LaneMetrics;

    impl LaneMetrics {
        pub(crate) fn started(&self) {}

        pub(crate) fn finished(&self) {}
    }

    /// Without the `metrics` feature: nothing, and no clock read.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Arrival;

    impl Arrival {
        pub(crate) fn now() -> Self {
            Arrival
        }

        pub(crate) fn none() -> Self {
            Arrival
        }
    }

    impl MountMetrics {
        pub(crate) fn new(
            _system: &'static str,
            _queue: &str,
            _dispatch: &'static str,
            _lanes: usize,
        ) -> Self {
            MountMetrics
        }

        pub(crate) fn first_run_started(
            &self,
            _delivery: &crate::delivery::Delivery,
            _arrival: Arrival,
        ) -> Option<Tick> {
            None
        }

        pub(crate) fn reconnecting(&self) {}

        pub(crate) fn lane(&self, _lane: usize) -> LaneMetrics {
            LaneMetrics
        }

        pub(crate) fn lane_queued(&self, _lane: usize) {}

        pub(crate) fn lanes_stopped(&self) {}

        pub(crate) fn consumed(&self, _count: u64) {}

        pub(crate) fn finished(&self, _count: u64) {}

        pub(crate) fn run_started(&self) -> Option<Tick> {
            None
        }

        pub(crate) fn run_ended(&self, _started: Option<Tick>) {}

        pub(crate) fn outcome(&self, _settlement: &Settlement<'_>) {}

        pub(crate) fn released(&self, _count: u64) {}

        pub(crate) fn decode_failed(&self) {}

        pub(crate) fn panicked(&self) {}
    }
}

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::{Arrival, LaneMetrics, MountMetrics};
#[cfg(feature = "metrics")]
pub(crate) use enabled::{Arrival, LaneMetrics, MountMetrics};

/// Whether Conveyor was built with the `metrics` feature: a transport can skip the work
/// of measuring when nothing would record it.
pub const ENABLED: bool = cfg!(feature = "metrics");

/// For transports: counts `messages` published to `destination`, or refused (with
/// `error`, a short low-cardinality kind such as `"refused"` or `"unavailable"`), as
/// `messaging.client.sent.messages`.
pub fn record_sent(
    system: &'static str,
    destination: &str,
    messages: u64,
    error: Option<&'static str>,
) {
    #[cfg(feature = "metrics")]
    {
        let mut labels = vec![
            metrics::Label::new("messaging.system", system),
            metrics::Label::new("messaging.destination.name", destination.to_string()),
        ];
        if let Some(error) = error {
            labels.push(metrics::Label::new("error.type", error));
        }
        metrics::counter!("messaging.client.sent.messages", labels).increment(messages);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (system, destination, messages, error);
}

/// The count of messages published to one destination, for a transport that keeps an
/// object per destination (the in-process broker's queues): its handle is registered at
/// the first publish and kept, where [`record_sent`] builds the series' key (two
/// allocations) and looks it up on every call.
#[derive(Debug, Default)]
pub(crate) struct SentCounter {
    #[cfg(feature = "metrics")]
    counter: std::sync::OnceLock<metrics::Counter>,
}

impl SentCounter {
    /// Counts `messages` published to `destination` (always the same one).
    pub(crate) fn record(&self, system: &'static str, destination: &str, messages: u64) {
        #[cfg(feature = "metrics")]
        self.counter
            .get_or_init(|| {
                metrics::counter!(
                    "messaging.client.sent.messages",
                    "messaging.system" => system,
                    "messaging.destination.name" => destination.to_string()
                )
            })
            .increment(messages);
        #[cfg(not(feature = "metrics"))]
        let _ = (system, destination, messages);
    }
}

/// For transports: counts a rejected message of `queue` moved to its dead-letter queue,
/// as `conveyor.dead_letters`.
pub fn record_dead_lettered(system: &'static str, queue: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "conveyor.dead_letters",
        "messaging.system" => system,
        "messaging.destination.name" => queue.to_string()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (system, queue);
}

/// For transports: counts a recovered connection, named `connection` (a name the
/// service gave it, or what it is for), as `conveyor.connection.reconnects`.
pub fn record_reconnect(system: &'static str, connection: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "conveyor.connection.reconnects",
        "messaging.system" => system,
        "conveyor.connection" => connection.to_string()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (system, connection);
}

/// For transports: records how long one broker call took, as
/// `messaging.client.operation.duration`: `operation` is the call's name (an SQS API
/// name, `publish` for a RabbitMQ publish with its confirm), `error` the kind of failure
/// if it failed.
pub fn record_operation(
    system: &'static str,
    operation: &str,
    elapsed: std::time::Duration,
    error: Option<&'static str>,
) {
    #[cfg(feature = "metrics")]
    {
        let mut labels = vec![
            metrics::Label::new("messaging.system", system),
            metrics::Label::new("messaging.operation.name", operation.to_string()),
        ];
        if let Some(error) = error {
            labels.push(metrics::Label::new("error.type", error));
        }
        metrics::histogram!("messaging.client.operation.duration", labels)
            .record(elapsed.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (system, operation, elapsed, error);
}
