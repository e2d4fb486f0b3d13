//! The transport kit: what every transport needs in the same shape, written once.
//!
//! - Settling: the table of deliveries not settled yet ([`TagTable`]), the queue their
//!   settlements wait in ([`SettleQueue`]), and the settle task that performs them in
//!   batches with slow ones beside the rest ([`SettleDriver`], given a [`Perform`]).
//! - Pacing: the pause between retries of a failing broker call or a reconnect, doubling
//!   ([`RetryPause`]), with jitter where many clients retry at once ([`jittered`]), and
//!   the instant a delay ends ([`due_after`]).
//! - Small pieces: a lock that outlives a panic ([`lock`]), a wait on a
//!   [`Notify`](tokio::sync::Notify) for a condition that misses no wake-up
//!   ([`wait_for`]), error texts that quote a name boundedly ([`bounded`]), URLs with
//!   their password hidden ([`redact_url`], [`url_password`]), and ids no one else makes
//!   ([`unique_id`]).

mod driver;
mod pace;
mod settle;
mod sync;
mod text;

pub use driver::{Perform, SettleDriver, Started};
pub use pace::{RetryPause, due_after, jittered};
pub use settle::{SettleQueue, TagTable};
pub use sync::{lock, wait_for};
pub use text::{bounded, redact_url, unique_id, url_password};
