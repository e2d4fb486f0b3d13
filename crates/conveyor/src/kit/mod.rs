//! The transport kit: what every transport needs in the same shape, written once.
//!
//! - Settling: the table of deliveries not settled yet ([`TagTable`]), the queue their
//!   settlements wait in ([`SettleQueue`]), and the settle task that performs them in
//!   batches with slow ones beside the rest ([`SettleDriver`], given a [`Perform`]).
//! - Pulling: a subscription on a broker that is pulled from ([`Pull`]): a pump that
//!   receives a call ahead of the handlers (given a [`Receive`]), the table of messages
//!   held under a lease ([`Leases`]), the settler that records each settlement on its lease
//!   ([`LeaseSettler`]; a [`Rejected`] message waits there for its dead letter), and the
//!   keeper that renews those leases and makes the settlement calls in batches (given a
//!   [`Keep`]); [`PullSubscriber`] is the whole subscriber, and [`CallHealth`] tells
//!   the mount whether the broker's calls fail.
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
mod keeper;
mod lease;
mod pace;
mod pull;
mod settle;
mod settler;
mod sync;
mod text;

pub use driver::{Perform, SettleDriver, Started};
pub use keeper::{Keep, Keeper, KeeperSignals, Renewed};
pub use lease::{LeaseTimes, Leases, Taken};
pub use pace::{RetryPause, due_after, jittered};
pub use pull::{Alive, CallHealth, Pull, PullOptions, PullSubscriber, Receive, ReceiveFailed};
pub use settle::{SettleQueue, TagTable};
pub use settler::{LeaseSettler, Rejected, past_max_receives};
pub use sync::{lock, wait_for};
pub use text::{bounded, redact_url, unique_id, url_password, without_password};
