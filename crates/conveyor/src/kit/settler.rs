//! Settling a pulling subscription's deliveries: a settlement is recorded on its
//! message's lease at once (settling never blocks), for the keeper to make the call.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

use tokio::sync::watch;

use super::keeper::Keep;
use super::lease::Leases;
use super::verdict::Verdict;
use crate::{Settle, Settled};

/// Keeps the deliveries' settler alive in the keeper's eyes: the keeper finishes once
/// the subscription closes, or once every clone of this is dropped (nothing more can be
/// settled).
#[derive(Clone, Debug)]
pub struct Alive {
    _sender: Arc<watch::Sender<()>>,
}

impl Alive {
    /// A token, and what the keeper watches ([`KeeperSignals::alive`]): it closes once
    /// every clone of the token is dropped. A pulling subscription makes this pair
    /// itself; a transport needs it only to run a [`Keeper`] on its own (in its tests,
    /// say).
    ///
    /// [`KeeperSignals::alive`]: super::KeeperSignals::alive
    /// [`Keeper`]: super::Keeper
    pub fn new() -> (Alive, watch::Receiver<()>) {
        let (sender, watch) = watch::channel(());
        (
            Alive {
                _sender: Arc::new(sender),
            },
            watch,
        )
    }
}

/// A pulling subscription's [`Settle`]: records each settlement's [`Verdict`] on the
/// message's lease, where the keeper takes it. Holds an [`Alive`] token, so the keeper
/// knows when no settler is left.
pub(crate) struct LeaseSettler<K: Keep> {
    leases: Arc<Leases<K::Data>>,
    _alive: Alive,
    _keep: PhantomData<fn() -> K>,
}

impl<K: Keep> LeaseSettler<K> {
    pub(crate) fn new(leases: Arc<Leases<K::Data>>, alive: Alive) -> Self {
        LeaseSettler {
            leases,
            _alive: alive,
            _keep: PhantomData,
        }
    }
}

impl<K: Keep> Settle for LeaseSettler<K> {
    fn settle(&self, settled: Settled<'_>) {
        let tag = settled.tag;
        if !self.leases.settle(tag, Verdict::of(settled)) {
            tracing::debug!(tag, "settled a message this subscription no longer holds");
        }
    }

    /// What the transport's [`Keep::record`] makes of the message's data.
    fn record(&self, tag: u64) -> Option<Box<dyn Any + Send>> {
        self.leases.with(tag, K::record).flatten()
    }
}
