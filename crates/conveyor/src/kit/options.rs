//! How a pulling subscription runs: one set of names on every transport.

use std::time::Duration;

/// How a pulling subscription runs, given by its transport to
/// [`PullSubscriber::start`](super::PullSubscriber::start). Each field is one concept
/// with one name on every pulling transport, whatever its broker calls it.
#[derive(Clone, Debug)]
pub struct PullOptions {
    /// The queue, as logs and errors name it.
    pub queue: String,
    /// How long a receive leases a message for, and a renewal renews it for: SQS's
    /// visibility timeout, JetStream's ack wait, how long a Redis entry stays pending
    /// before another consumer may claim it.
    pub lease: Duration,
    /// The most messages one receive asks for. The pump receives only while fewer than
    /// the mount's `max_in_flight` plus this many are held (waiting, running, or settled
    /// with their call not made yet).
    pub receive_batch: usize,
    /// The longest one receive can take (its wait on the broker and its timeout):
    /// closing waits that long for one under way, then abandons it.
    pub receive_bound: Duration,
    /// How long a settlement waits for others to share its call.
    pub settle_linger: Duration,
    /// The most settlements one settlement call takes, and the most leases one renewal
    /// call takes.
    pub settle_batch: usize,
}
