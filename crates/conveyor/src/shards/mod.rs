//! Ordered shards over replicas: a keyed queue split into `K` shard queues, each consumed
//! by one replica of a service at a time, spread evenly over the replicas that run.
//!
//! The contract, whatever the broker:
//!
//! - A **plan** says which shards this replica should hold. It comes from a membership
//!   that the transport keeps through its broker (RabbitMQ: heartbeats over a fanout
//!   exchange, `conveyor_lapin::ReplicaGroup`), and [`assign`] makes it from the live
//!   members, so every replica computes the same plan from the same view.
//! - [`Shards`] is a [`Source`](crate::Source) over the shard queues that follows the
//!   plan: it holds one subscription per shard the plan gives it and merges their
//!   deliveries into one stream (mount it like any queue, usually with
//!   `workers(n).by_key()`).
//! - **Giving a shard up drains it first**: the shard's deliveries stop going to the
//!   handlers; once every one already handed out is settled, its subscription closes,
//!   so its read-ahead goes back to the queue, in order, for the next holder. A key is
//!   never handled by two replicas at once, and its order holds across the move.
//! - **Taking a shard** opens its subscription at once. The broker must keep a second
//!   consumer of a shard idle until the first one is gone (RabbitMQ's single active
//!   consumer): that is what makes a brief disagreement between two replicas' views
//!   harmless.
//!
//! What the replica holds now is in [`RunningApp::health`](crate::RunningApp::health)
//! and [`RunningApp::lanes`](crate::RunningApp::lanes) (`shards`), and in
//! [`PlanSender::held`] for the membership's heartbeats.

mod assign;
mod source;

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

pub use assign::{assign, assigned_to};
pub use source::{Shards, ShardsSubscriber};

use crate::kit;

/// Makes a plan: the sender a membership sets, and the [`ShardPlan`] a [`Shards`] source
/// follows. The plan starts empty (hold nothing until the membership knows its peers).
///
/// ```
/// use conveyor::shards;
///
/// let (sender, plan) = shards::plan();
/// sender.set(vec![3, 1]);
/// assert_eq!(plan.wanted(), [1, 3]);
/// assert!(sender.held().is_empty()); // nothing subscribed yet
/// ```
pub fn plan() -> (PlanSender, ShardPlan) {
    let (wanted, receiver) = watch::channel(Vec::new());
    let held = HeldShards::default();
    (
        PlanSender {
            wanted,
            held: held.clone(),
        },
        ShardPlan {
            wanted: receiver,
            held,
        },
    )
}

/// The membership's side of a plan: sets which shards this replica should hold, and
/// reads which it holds now.
#[derive(Debug)]
pub struct PlanSender {
    wanted: watch::Sender<Vec<usize>>,
    held: HeldShards,
}

impl PlanSender {
    /// This replica should hold `shards` (in any order; duplicates are dropped).
    pub fn set(&self, mut shards: Vec<usize>) {
        shards.sort_unstable();
        shards.dedup();
        self.wanted.send_if_modified(|wanted| {
            let changed = *wanted != shards;
            *wanted = shards;
            changed
        });
    }

    /// The shards whose subscription is open now, in order: the plan's, plus those being
    /// drained before they are given up, less those still being opened.
    pub fn held(&self) -> Vec<usize> {
        self.held.get()
    }
}

/// The plan a [`Shards`] source follows (see [`plan`]).
#[derive(Clone, Debug)]
pub struct ShardPlan {
    wanted: watch::Receiver<Vec<usize>>,
    held: HeldShards,
}

impl ShardPlan {
    /// The shards this replica should hold now, in order.
    pub fn wanted(&self) -> Vec<usize> {
        self.wanted.borrow().clone()
    }
}

/// The shards whose subscription is open, shared by a [`Shards`] subscriber (which
/// writes it), its [`PlanSender`] and the app's health (see
/// [`Subscriber::shards`](crate::Subscriber::shards)).
#[derive(Clone, Debug, Default)]
pub struct HeldShards(Arc<Mutex<Vec<usize>>>);

impl HeldShards {
    /// The shards held now, in order.
    pub fn get(&self) -> Vec<usize> {
        kit::lock(&self.0).clone()
    }

    fn insert(&self, shard: usize) {
        let mut held = kit::lock(&self.0);
        if let Err(at) = held.binary_search(&shard) {
            held.insert(at, shard);
        }
    }

    fn remove(&self, shard: usize) {
        let mut held = kit::lock(&self.0);
        if let Ok(at) = held.binary_search(&shard) {
            held.remove(at);
        }
    }
}
