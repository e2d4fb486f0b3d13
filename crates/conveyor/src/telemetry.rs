//! A mount's metrics, through the [`metrics`](https://docs.rs/metrics) facade, so that any
//! exporter works (Prometheus, StatsD, OpenTelemetry...). Built with the `metrics` cargo
//! feature; without it every call here is empty and compiles away.
//!
//! Names and units follow OpenTelemetry's messaging conventions where they have one:
//!
//! | name | kind | what |
//! | --- | --- | --- |
//! | `messaging.client.consumed.messages` | counter | deliveries taken from the queue |
//! | `messaging.process.duration` | histogram, seconds | one run of a handler |
//! | `conveyor.outcomes` | counter, by `conveyor.outcome` | `ack`, `retry`, `retry_after`, `reject` |
//! | `conveyor.decode_failures` | counter | payloads or extractors a handler could not take |
//! | `conveyor.panics` | counter | panics caught in decoding, extractors or handlers |
//! | `conveyor.in_flight` | gauge | deliveries a mount's handlers are running |
//!
//! Every series carries `messaging.system`, `messaging.destination.name` (the queue) and
//! `conveyor.dispatch` (the mount's mode). No label ever holds a partition key or message
//! id: the number of series stays that of the mounts. Handles are registered once, when
//! a mount starts, so install the recorder before starting the app.

use std::time::Instant;

/// What a settlement was, for the outcome counter.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OutcomeKind {
    Ack,
    Retry,
    RetryAfter,
    Reject,
}

#[cfg(feature = "metrics")]
mod enabled {
    use super::{Instant, OutcomeKind};
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
        decode_failures: Counter,
        panics: Counter,
        in_flight: Gauge,
    }

    impl std::fmt::Debug for MountMetrics {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("MountMetrics")
        }
    }

    impl MountMetrics {
        pub(crate) fn new(system: &'static str, queue: &str, dispatch: &'static str) -> Self {
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
            MountMetrics {
                consumed: metrics::counter!("messaging.client.consumed.messages", labels.clone()),
                duration: metrics::histogram!("messaging.process.duration", labels.clone()),
                acked: outcome("ack"),
                retried: outcome("retry"),
                retried_later: outcome("retry_after"),
                rejected: outcome("reject"),
                decode_failures: metrics::counter!("conveyor.decode_failures", labels.clone()),
                panics: metrics::counter!("conveyor.panics", labels.clone()),
                in_flight: metrics::gauge!("conveyor.in_flight", labels),
            }
        }

        pub(crate) fn consumed(&self, count: u64) {
            self.consumed.increment(count);
            // Counts as f64: exact for any count a mount can hold.
            self.in_flight.increment(count as f64);
        }

        pub(crate) fn finished(&self, count: u64) {
            self.in_flight.decrement(count as f64);
        }

        pub(crate) fn run_started(&self) -> Option<Instant> {
            Some(Instant::now())
        }

        pub(crate) fn run_ended(&self, started: Option<Instant>) {
            if let Some(started) = started {
                self.duration.record(started.elapsed().as_secs_f64());
            }
        }

        pub(crate) fn outcome(&self, outcome: OutcomeKind) {
            match outcome {
                OutcomeKind::Ack => &self.acked,
                OutcomeKind::Retry => &self.retried,
                OutcomeKind::RetryAfter => &self.retried_later,
                OutcomeKind::Reject => &self.rejected,
            }
            .increment(1);
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
    use super::{Instant, OutcomeKind};

    /// Without the `metrics` feature: nothing, at no cost.
    #[derive(Clone, Debug)]
    pub(crate) struct MountMetrics;

    impl MountMetrics {
        pub(crate) fn new(_system: &'static str, _queue: &str, _dispatch: &'static str) -> Self {
            MountMetrics
        }

        pub(crate) fn consumed(&self, _count: u64) {}

        pub(crate) fn finished(&self, _count: u64) {}

        pub(crate) fn run_started(&self) -> Option<Instant> {
            None
        }

        pub(crate) fn run_ended(&self, _started: Option<Instant>) {}

        pub(crate) fn outcome(&self, _outcome: OutcomeKind) {}

        pub(crate) fn decode_failed(&self) {}

        pub(crate) fn panicked(&self) {}
    }
}

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::MountMetrics;
#[cfg(feature = "metrics")]
pub(crate) use enabled::MountMetrics;
