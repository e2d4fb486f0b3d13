//! How a running app is doing, mount by mount: what a liveness or readiness probe asks.
//!
//! ```
//! use conveyor::{App, Json, MemoryBroker, MountState};
//!
//! # async fn handle(Json(n): Json<u64>) {}
//! # async fn f() -> Result<(), conveyor::Error> {
//! let broker = MemoryBroker::new();
//! let app = App::new("orders").mount(broker.queue("orders"), handle, |m| m).start().await?;
//! let health = app.health();
//! assert!(health.is_live() && health.is_ready());
//! assert_eq!(health.mounts[0].state, MountState::Running);
//! app.shutdown().await
//! # }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::kit;
use crate::lanes_view::LaneStats;
use crate::transport::{ConnectionHealth, ConnectionProbe, ConnectionState, ShardsProbe};

/// Where one mount is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MountState {
    /// Receiving and handling.
    Running,
    /// Its connection to the broker is lost, or receiving fails, and it is trying again.
    /// Handlers already running go on.
    Reconnecting,
    /// The app is shutting down: nothing more is received; running handlers finish.
    Draining,
    /// Shut down.
    Stopped,
    /// Ended for good while the app was running, with the error.
    Failed(String),
}

/// One mount's health.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MountHealth {
    /// The queue it is mounted on.
    pub queue: String,
    /// Where it is.
    pub state: MountState,
    /// For a mount on several shard queues ([`crate::shards::Shards`]): the shards this
    /// replica holds now, in order. `None` for a mount on one queue.
    pub shards: Option<Vec<usize>>,
}

/// A running app's health: every mount's state, and every connection of the brokers
/// given with [`App::broker`](crate::App::broker).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The app's name.
    pub app: String,
    /// Every mount, in the order they were mounted.
    pub mounts: Vec<MountHealth>,
    /// Every connection of the app's brokers, in the order the brokers were given (a
    /// broker over HTTP, like SQS, keeps none: its calls show in its mounts' states).
    pub connections: Vec<ConnectionHealth>,
}

impl Health {
    /// Whether the app should be left running: no mount has failed. A mount that is
    /// reconnecting is alive (restarting the process would not bring the broker back).
    pub fn is_live(&self) -> bool {
        !self
            .mounts
            .iter()
            .any(|mount| matches!(mount.state, MountState::Failed(_)))
    }

    /// Whether the app is doing its work: every mount is running, and every broker
    /// connection up. A blocked connection counts as up: a RabbitMQ resource alarm blocks
    /// every client of the cluster at once, and the mounts go on consuming and acking
    /// meanwhile (only publishes wait), so no replica would be any readier.
    pub fn is_ready(&self) -> bool {
        self.mounts
            .iter()
            .all(|mount| mount.state == MountState::Running)
            && self.connections.iter().all(|connection| {
                matches!(
                    connection.state,
                    ConnectionState::Connected | ConnectionState::Blocked
                )
            })
    }
}

/// What the app knows of one mount, shared by the mount's task and the running app.
#[derive(Clone, Default)]
pub(crate) struct MountStatus {
    /// Set by the dispatcher while receives fail.
    receive_failing: Arc<AtomicBool>,
    /// The transport's own probe, if it gives one.
    transport: Arc<OnceLock<Arc<dyn ConnectionProbe>>>,
    /// Set when the mount's task has ended: `None` for a clean end.
    ended: Arc<Mutex<Option<Option<String>>>>,
    /// A lanes mount's live counters.
    lanes: Arc<OnceLock<Arc<LaneStats>>>,
    /// The shards a mount on several shard queues holds.
    shards: Arc<OnceLock<Arc<dyn ShardsProbe>>>,
}

impl std::fmt::Debug for MountStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountStatus")
            .field("receive_failing", &self.receive_failing)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl MountStatus {
    /// A receive failed: the mount is reconnecting while it pauses before the next.
    pub(crate) fn receive_failed(&self) {
        self.receive_failing.store(true, Ordering::Relaxed);
    }

    /// The pause after a failed receive is over: receiving again.
    pub(crate) fn received(&self) {
        self.receive_failing.store(false, Ordering::Relaxed);
    }

    /// Keeps the probe the subscription gives, if any.
    pub(crate) fn follow(&self, transport: Option<Arc<dyn ConnectionProbe>>) {
        if let Some(probe) = transport {
            let _ = self.transport.set(probe);
        }
    }

    /// Keeps the shards probe the subscription gives, if any.
    pub(crate) fn follow_shards(&self, shards: Option<Arc<dyn ShardsProbe>>) {
        if let Some(probe) = shards {
            let _ = self.shards.set(probe);
        }
    }

    /// The shards the mount holds now, for a mount on several shard queues.
    pub(crate) fn shards(&self) -> Option<Vec<usize>> {
        self.shards.get().map(|probe| probe.held())
    }

    /// The counters of a lanes mount with `lanes` lanes, made on first call: by the app
    /// as it starts the mount, so [`RunningApp::lanes`](crate::RunningApp::lanes) lists
    /// it at once, and by the mount's dispatcher.
    pub(crate) fn lane_stats(&self, lanes: usize) -> Arc<LaneStats> {
        self.lanes
            .get_or_init(|| Arc::new(LaneStats::new(lanes)))
            .clone()
    }

    /// A lanes mount's counters.
    pub(crate) fn lanes(&self) -> Option<&LaneStats> {
        self.lanes.get().map(|stats| &**stats)
    }

    fn connection_lost(&self) -> bool {
        self.receive_failing.load(Ordering::Relaxed)
            || self.transport.get().is_some_and(|probe| probe.is_lost())
    }

    /// The mount's task has ended, cleanly or with `error`.
    pub(crate) fn ended(&self, error: Option<String>) {
        *kit::lock(&self.ended) = Some(error);
    }

    /// The mount's state, given whether the app is shutting down.
    pub(crate) fn state(&self, shutting_down: bool) -> MountState {
        match kit::lock(&self.ended).clone() {
            Some(Some(error)) => MountState::Failed(error),
            Some(None) if shutting_down => MountState::Stopped,
            Some(None) => MountState::Failed("the subscription ended".to_string()),
            None if shutting_down => MountState::Draining,
            None if self.connection_lost() => MountState::Reconnecting,
            None => MountState::Running,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(connections: &[ConnectionState]) -> Health {
        Health {
            app: "app".into(),
            mounts: vec![MountHealth {
                queue: "q".into(),
                state: MountState::Running,
                shards: None,
            }],
            connections: connections
                .iter()
                .map(|&state| ConnectionHealth::new("c", state))
                .collect(),
        }
    }

    #[test]
    fn an_app_is_ready_only_while_every_connection_is_up_and_live_whatever_they_are() {
        use ConnectionState::*;
        assert!(health(&[]).is_ready());
        assert!(health(&[Connected, Blocked]).is_ready());
        for other in [Reconnecting, Closed] {
            let health = health(&[Connected, other]);
            assert!(!health.is_ready() && health.is_live(), "{other:?}");
        }
    }
}
