//! The transport kit: what every transport needs in the same shape, written once.
//!
//! - Settling: the table of deliveries not settled yet ([`TagTable`]), the queue their
//!   settlements wait in ([`SettleQueue`]), and the settle task that performs them in
//!   batches with slow ones beside the rest ([`SettleDriver`], given a [`Perform`]).
//! - Pulling: a subscription on a broker that is pulled from, started in one call
//!   ([`PullSubscriber::start`]) from the transport's receive side (a [`Receive`], which
//!   holds each message it brings in [`Received`]) and its settle side (a [`Keep`], which
//!   renews leases and turns each [`Verdict`] into the broker's calls), as
//!   [`PullOptions`] say. Inside: a pump that receives a call ahead of the handlers, the
//!   table of messages held under a lease ([`Leases`]), and the keeper that renews them
//!   and makes the settlement calls in batches ([`Keeper`]); [`CallHealth`] tells the
//!   mount whether the broker's calls fail. A [`Rejected`] message waits in its verdict
//!   for its dead letter.
//! - Queues on brokers that keep no policy of their own: a queue's dead-letter policy
//!   and visibility timeout as the transport stores it ([`QueuePolicy`]), and taking its
//!   dead letters a batch at a time ([`drain_dead_letters`]).
//! - Pacing: the pause between retries of a failing broker call or a reconnect, doubling
//!   ([`RetryPause`]), with jitter where many clients retry at once ([`jittered`]), and
//!   the instant a delay ends ([`due_after`]).
//! - Small pieces: a lock that outlives a panic ([`lock`]), a wait on a
//!   [`Notify`](tokio::sync::Notify) for a condition that misses no wake-up
//!   ([`wait_for`]), error texts that quote a name boundedly ([`bounded`]), URLs with
//!   their password hidden ([`redact_url`], [`url_password`]), and ids no one else makes
//!   ([`unique_id`]).

pub(crate) mod beside;
mod driver;
mod health;
mod keeper;
mod lease;
mod options;
mod pace;
mod policy;
mod pull;
mod settle;
mod settler;
mod sync;
mod text;
mod verdict;

pub use driver::{Perform, SettleDriver, Started};
pub use health::CallHealth;
pub use keeper::{Keep, Keeper, KeeperSignals, Renewed};
pub use lease::{LeaseTimes, Leases, Taken};
pub use options::PullOptions;
pub use pace::{RetryPause, due_after, jittered};
pub use policy::{QueuePolicy, drain_dead_letters};
pub use pull::{PullSubscriber, Receive, ReceiveFailed, Received, ReceivedMessage};
pub use settle::{SettleQueue, TagTable};
pub use settler::Alive;
pub use sync::{lock, wait_for};
pub use text::{bounded, redact_url, unique_id, url_password, without_password};
pub use verdict::{Rejected, Verdict, past_max_receives};
