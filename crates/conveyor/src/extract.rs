//! Handler arguments after the payload: extractors.
//!
//! Every argument of a handler after the first is built from the delivery and the app's
//! context by [`FromDelivery`]: the [`PartitionKey`] (or `Option<PartitionKey>`), the
//! [`Headers`], [`DeliveryInfo`] (queue, receive count) and typed [`State`]. Batch
//! handlers take arguments that need no single delivery, through [`FromContext`].

use std::any::type_name;
use std::fmt;
use std::sync::Arc;

use crate::delivery::Delivery;
use crate::error::Error;
use crate::headers::Headers;
use crate::message::PartitionKey;
use crate::route::Route;
use crate::state::StateMap;

/// What a handler can see besides its delivery: the queue it is mounted on and the app's
/// shared state.
#[derive(Clone, Debug)]
pub struct Context {
    queue: Arc<str>,
    state: Arc<StateMap>,
    route: Route,
    /// The mount decodes every payload whatever its content type
    /// ([`MountOptions::any_content_type`](crate::MountOptions::any_content_type)).
    any_content_type: bool,
}

impl Context {
    /// A context for a handler mounted on `queue`.
    pub fn new(queue: Arc<str>, state: Arc<StateMap>) -> Self {
        Context {
            queue,
            state,
            route: Route::default(),
            any_content_type: false,
        }
    }

    /// The same, decoding every payload whatever its content type.
    pub(crate) fn with_any_content_type(mut self, any: bool) -> Self {
        self.any_content_type = any;
        self
    }

    /// Whether the mount decodes every payload whatever its content type.
    pub(crate) fn any_content_type(&self) -> bool {
        self.any_content_type
    }

    /// The same, with where the handler's outputs go.
    pub(crate) fn with_route(mut self, route: Route) -> Self {
        self.route = route;
        self
    }

    /// Where the handler's outputs go.
    pub(crate) fn route(&self) -> &Route {
        &self.route
    }

    /// The queue the handler is mounted on.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The app's shared state.
    pub fn state(&self) -> &StateMap {
        &self.state
    }
}

/// Why an extractor could not build its argument. The delivery is rejected with this as
/// the reason, the same fate as a payload that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejection(String);

impl Rejection {
    /// A rejection with this reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Rejection(reason.into())
    }
}

/// A handler argument built from the delivery and the context.
pub trait FromDelivery: Sized + Send + 'static {
    /// Builds the argument; an error rejects the delivery.
    ///
    /// # Errors
    ///
    /// A [`Rejection`], which rejects the delivery with it as the reason.
    fn from_delivery(delivery: &Delivery, cx: &Context) -> Result<Self, Rejection>;

    /// Checked once when the app starts, so that a handler that can never run (a missing
    /// state) fails startup rather than every delivery.
    ///
    /// # Errors
    ///
    /// An [`Error`] that stops the app from starting.
    fn check(cx: &Context) -> Result<(), Error> {
        let _ = cx;
        Ok(())
    }
}

/// A batch handler argument built from the context alone.
pub trait FromContext: Sized + Send + 'static {
    /// Builds the argument; an error rejects the whole batch.
    ///
    /// # Errors
    ///
    /// A [`Rejection`], which rejects every delivery of the batch with it as the reason.
    fn from_context(cx: &Context) -> Result<Self, Rejection>;

    /// Checked once when the app starts, like [`FromDelivery::check`].
    ///
    /// # Errors
    ///
    /// An [`Error`] that stops the app from starting.
    fn check(cx: &Context) -> Result<(), Error> {
        let _ = cx;
        Ok(())
    }
}

/// The partition key is required: a delivery without one is rejected.
impl FromDelivery for PartitionKey {
    fn from_delivery(delivery: &Delivery, _: &Context) -> Result<Self, Rejection> {
        delivery.partition_key().cloned().ok_or_else(|| {
            Rejection::new("the handler needs a partition key and the message has none")
        })
    }
}

impl FromDelivery for Option<PartitionKey> {
    fn from_delivery(delivery: &Delivery, _: &Context) -> Result<Self, Rejection> {
        Ok(delivery.partition_key().cloned())
    }
}

impl FromDelivery for Headers {
    fn from_delivery(delivery: &Delivery, _: &Context) -> Result<Self, Rejection> {
        Ok(delivery.headers().clone())
    }
}

/// Where a delivery came from and how often it was handed out.
#[derive(Clone, Debug)]
pub struct DeliveryInfo {
    /// The queue it came from.
    pub queue: Arc<str>,
    /// How many times the broker handed it out, this time included, where it counts.
    pub receive_count: Option<u32>,
    /// Whether it was handed out before.
    pub redelivered: bool,
    /// Which attempt this is, from 1 (see [`Delivery::attempt`]).
    pub attempt: u32,
    /// The lane running it, under `workers(n).by_key()` dispatch.
    pub lane: Option<usize>,
}

impl DeliveryInfo {
    pub(crate) fn of(delivery: &Delivery) -> Self {
        DeliveryInfo {
            queue: delivery.shared_queue().clone(),
            receive_count: delivery.receive_count(),
            redelivered: delivery.redelivered(),
            attempt: delivery.attempt(),
            lane: delivery.lane(),
        }
    }
}

impl FromDelivery for DeliveryInfo {
    fn from_delivery(delivery: &Delivery, _: &Context) -> Result<Self, Rejection> {
        Ok(DeliveryInfo::of(delivery))
    }
}

/// A clone of the app's shared value of type `T`, given with
/// [`App::with_state`](crate::App::with_state).
///
/// An app started with a handler that needs state it lacks fails at startup with
/// [`Error::MissingState`].
///
/// ```
/// use conveyor::{Json, State};
///
/// #[derive(Clone)]
/// struct Db;
///
/// async fn save(Json(id): Json<u64>, State(db): State<Db>) {
///     let _ = (id, db);
/// }
/// ```
#[derive(Clone, Copy, Default)]
pub struct State<T>(pub T);

impl<T: fmt::Debug> fmt::Debug for State<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Clone + Send + Sync + 'static> FromContext for State<T> {
    fn from_context(cx: &Context) -> Result<Self, Rejection> {
        cx.state
            .get::<T>()
            .cloned()
            .map(State)
            .ok_or_else(|| Rejection::new(format!("no state of type {}", type_name::<T>())))
    }

    fn check(cx: &Context) -> Result<(), Error> {
        if cx.state.contains::<T>() {
            Ok(())
        } else {
            Err(Error::MissingState {
                queue: cx.queue.to_string(),
                type_name: type_name::<T>(),
            })
        }
    }
}

impl<T: Clone + Send + Sync + 'static> FromDelivery for State<T> {
    fn from_delivery(_: &Delivery, cx: &Context) -> Result<Self, Rejection> {
        <Self as FromContext>::from_context(cx)
    }

    fn check(cx: &Context) -> Result<(), Error> {
        <Self as FromContext>::check(cx)
    }
}
