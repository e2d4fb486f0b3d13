//! Layers: code that runs around every call of a handler.
//!
//! A [`Layer`] gets the delivery and the handler's run, not yet started. It can look at
//! the delivery, await the run (or not) and return the outcome it likes: change it,
//! short-circuit the handler, time the run out. Mount one on a single mount with
//! [`MountOptions::layer`](crate::MountOptions::layer), or on every mount of an app with
//! [`App::layer`](crate::App::layer).
//!
//! ```
//! use std::future::Future;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use conveyor::{BoxError, Delivery, Layer, Outcome};
//!
//! /// Counts the handler runs that failed.
//! #[derive(Default)]
//! struct CountFailures(AtomicU64);
//!
//! impl Layer for CountFailures {
//!     async fn call<'a, N>(&'a self, _delivery: &'a Delivery, next: N) -> Result<Outcome, BoxError>
//!     where
//!         N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
//!     {
//!         let outcome = next.await;
//!         if outcome.is_err() {
//!             self.0.fetch_add(1, Ordering::Relaxed);
//!         }
//!         outcome
//!     }
//! }
//! ```
//!
//! A layer is written as an `async fn`, as above; its future must be `Send`.
//!
//! # Why not `tower`
//!
//! A `tower::Service` owns its request and returns a future that borrows nothing, of a
//! type the service must name. A handler's run borrows its delivery, which the
//! dispatcher keeps to settle it afterwards, so a `Service` would need the delivery moved
//! in and out of it and each layer's future boxed, an allocation per delivery and per
//! layer; and `poll_ready`'s back-pressure would duplicate the mount's own window.
//! `Layer` is generic over the run it wraps instead: the layers of a mount compile into
//! one future with the handler's, with no allocation, and a mount without layers runs
//! the handler's future as it is.

use std::future::Future;

use crate::delivery::Delivery;
use crate::error::BoxError;
use crate::outcome::Outcome;

/// Code around every call of a handler (see the [module docs](crate::layer)).
///
/// `next` is the rest of the chain: the inner layers and the handler, already given
/// their decoded arguments and not yet started. Await it to run them; drop it to skip
/// them. What the returned future gives is the outcome the dispatcher settles the
/// delivery by, and an error goes to the mount's failure policy, as a handler's would.
/// A panic in a layer is caught like a handler's. A payload the handler cannot decode
/// is rejected before any layer runs.
///
/// `call` must only build the future; the work belongs inside it.
pub trait Layer: Send + Sync + 'static {
    /// Wraps one run of the handler.
    fn call<'a, N>(
        &'a self,
        delivery: &'a Delivery,
        next: N,
    ) -> impl Future<Output = Result<Outcome, BoxError>> + Send + 'a
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a;
}

/// No layer: the handler runs as it is. The default of every mount and app.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity;

impl Layer for Identity {
    fn call<'a, N>(
        &'a self,
        _delivery: &'a Delivery,
        next: N,
    ) -> impl Future<Output = Result<Outcome, BoxError>> + Send + 'a
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        next
    }
}

/// Two layers, `outer` around `inner`: what [`App::layer`](crate::App::layer) and
/// [`MountOptions::layer`](crate::MountOptions::layer) build when called more than once.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stack<Outer, Inner> {
    outer: Outer,
    inner: Inner,
}

impl<Outer, Inner> Stack<Outer, Inner> {
    /// `outer` around `inner`.
    pub fn new(outer: Outer, inner: Inner) -> Self {
        Stack { outer, inner }
    }
}

impl<Outer: Layer, Inner: Layer> Layer for Stack<Outer, Inner> {
    fn call<'a, N>(
        &'a self,
        delivery: &'a Delivery,
        next: N,
    ) -> impl Future<Output = Result<Outcome, BoxError>> + Send + 'a
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        self.outer.call(delivery, self.inner.call(delivery, next))
    }
}
