//! Where a mount's outputs go, as its handler runs see it: below both the extractors'
//! [`Context`](crate::Context) that carries it and the output publishing that reads it.

use std::sync::Arc;

use crate::transport::SharedPublisher;

/// Where a mount's outputs go: set at the mount site, resolved when the app starts.
#[derive(Clone, Debug, Default)]
pub(crate) struct Route {
    /// The publisher of the broker the mount consumes from: replies go back through it.
    pub(crate) own: Option<SharedPublisher>,
    /// The mount's `publish_via`, for every other output.
    pub(crate) via: Option<SharedPublisher>,
    /// The mount's `publish_to`.
    pub(crate) destination: Option<Arc<str>>,
}
