//! A transport's broker connections, as the app's health reports them.

/// Where one broker connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Open and usable.
    Connected,
    /// Open, but the broker has stopped reading what it sends (RabbitMQ blocks a
    /// publishing connection during a resource alarm): its publishes wait. Still counts
    /// as ready (see [`Health::is_ready`](crate::Health::is_ready)).
    Blocked,
    /// Lost, and being recovered.
    Reconnecting,
    /// Closed for good.
    Closed,
}

/// One broker connection's health.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionHealth {
    /// What the connection is for (RabbitMQ: `consuming` or `publishing`).
    pub name: String,
    /// Where it is.
    pub state: ConnectionState,
}

impl ConnectionHealth {
    /// A connection named `name` in `state`: for transports.
    pub fn new(name: impl Into<String>, state: ConnectionState) -> Self {
        ConnectionHealth {
            name: name.into(),
            state,
        }
    }
}

/// Tells whether a subscription's connection is lost, when asked: what a transport that
/// recovers its connection by itself, out of sight of
/// [`Subscriber::recv`](crate::Subscriber::recv), hands to the core through
/// [`Subscriber::connection`](crate::Subscriber::connection). The mount shows as
/// [`MountState::Reconnecting`](crate::MountState::Reconnecting) while it answers `true`. It is asked only when
/// [`RunningApp::health`](crate::RunningApp::health) is, so keep it cheap and never block.
pub trait ConnectionProbe: Send + Sync + 'static {
    /// Whether the connection is lost now (and being recovered).
    fn is_lost(&self) -> bool;
}
