//! What lapin reports about a connection: logged, counted, and passed to those waiting.

use super::*;

/// The connection whose events [`log_events`] follows: its URL (redacted), its name,
/// and the nodes it dials.
pub(super) struct Watched {
    pub(super) url: String,
    pub(super) name: String,
    pub(super) nodes: Arc<Rotation>,
}

/// Logs what lapin reports about the connection: errors it does not recover from, and
/// the broker's flow control; counts each recovery in the `conveyor.connection.reconnects`
/// metric. (Subscriptions and publishers simply carry on once it has reconnected.)
pub(super) async fn log_events(
    events: impl futures_util::Stream<Item = lapin::Event>,
    watched: Watched,
    dialer: Arc<Dialer>,
    unblocked: Arc<tokio::sync::Notify>,
) {
    let Watched { url, name, nodes } = watched;
    // With fallback nodes, the URL's node may not be the one in use: each line names
    // the node too (the one connected to, or while reconnecting, the one lost).
    let node = || nodes.in_use().unwrap_or_default();
    use futures_util::StreamExt;
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            // A missing queue or exchange closes only its channel, and the call that met
            // it returns the error (a passive check's answer, most of the time): nothing
            // for the connection's log to warn about.
            lapin::Event::Error(error) if crate::error::is_not_found(&error) => {
                tracing::debug!(url = %url, error = %conveyor::Report(&error), "RabbitMQ closed a channel: not found");
            }
            lapin::Event::Error(error) => {
                tracing::warn!(url = %url, node = %node(), error = %conveyor::Report(&error), "RabbitMQ connection error");
            }
            lapin::Event::ConnectionBlocked(reason) => {
                tracing::warn!(url = %url, node = %node(), reason, "RabbitMQ blocked the connection");
            }
            lapin::Event::ConnectionUnblocked => {
                tracing::info!(url = %url, node = %node(), "RabbitMQ unblocked the connection");
                unblocked.notify_waiters();
            }
            lapin::Event::Connected => {
                if dialer.connected() {
                    conveyor::telemetry::record_reconnect("rabbitmq", &name);
                }
                unblocked.notify_waiters();
                tracing::info!(url = %url, node = %node(), "RabbitMQ connection (re)established");
            }
            _ => {}
        }
    }
}
