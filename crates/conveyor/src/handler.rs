//! Handlers: plain async functions over a payload and extractors.
//!
//! A handler's first argument is the payload, decoded by its type's [`FromPayload`]
//! ([`Json<T>`](crate::Json), `Bytes`, `String`, ...). Up to eight more arguments follow,
//! each a [`FromDelivery`] extractor. It returns anything [`IntoReply`]: `()`, an
//! [`Outcome`](crate::Outcome), messages to publish before the ack (see
//! [`crate::output`]), or a `Result` of any of these.
//!
//! A batch handler takes a [`Batch<P>`] of payloads first, then [`FromContext`]
//! extractors, and returns anything [`IntoBatchOutcome`]: one outcome for all, or one per
//! element.
//!
//! ```
//! use conveyor::{Batch, Json, Outcome, PartitionKey};
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! async fn one(Json(order): Json<Order>, key: PartitionKey) -> Result<(), std::io::Error> {
//!     println!("{key}: order {}", order.id);
//!     Ok(())
//! }
//!
//! async fn many(orders: Batch<Json<Order>>) -> Vec<Outcome> {
//!     orders.iter().map(|Json(o)| if o.id > 0 { Outcome::Ack } else { Outcome::Reject }).collect()
//! }
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::batch::{Batch, IntoBatchOutcome};
use crate::delivery::Delivery;
use crate::dispatch::{self, Run};
use crate::error::{BoxError, Error};
use crate::extract::{Context, FromContext, FromDelivery, Rejection};
use crate::layer::Layer;
use crate::outcome::Outcome;
use crate::output::IntoReply;
use crate::payload::{DecodeError, FromPayload, PayloadFormat};
use crate::transport::Subscriber;

/// A function that can be mounted on a subscription.
///
/// Implemented for async functions (and closures returning futures) whose arguments are a
/// payload followed by extractors, or a [`Batch`] followed by context extractors. `Args`
/// is a marker that tells the two shapes apart; you never name it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be mounted as a handler",
    note = "a handler is an async fn whose first argument implements `FromPayload` (`Json<T>`, `Bytes`, `String`) and whose further arguments implement `FromDelivery` (`PartitionKey`, `Headers`, `DeliveryInfo`, `State<T>`), returning `()`, an `Outcome`, messages to publish (`Message`, `Output`, an `Option` or `Vec` of them) or a `Result`",
    note = "a batch handler takes `Batch<P>` first, then `FromContext` arguments (`State<T>`), and returns `()`, an `Outcome`, a `Vec<Outcome>` or a `Result` of one"
)]
pub trait Handler<Args>: Clone + Send + Sync + 'static {
    /// The dispatch engine's view of the handler (sealed: it cannot be named outside
    /// Conveyor).
    #[doc(hidden)]
    type Endpoint: Unlayered;

    /// Wraps the handler for the dispatch engine.
    #[doc(hidden)]
    fn into_endpoint(self) -> Self::Endpoint;
}

/// The dispatch engine's side of a handler: public in name, because [`Handler`] mentions
/// it, but in a private module, so no one outside the crate can name or implement it.
mod sealed {
    use super::*;

    /// Marks a handler that takes one delivery at a time; `A` lists its argument types.
    pub struct Single<A>(PhantomData<fn() -> A>);

    /// Marks a handler that takes a batch; `A` lists its argument types.
    pub struct Batched<A>(PhantomData<fn() -> A>);

    /// A handler before its layers. Not for implementing by hand.
    pub trait Unlayered: Send + Sync + Sized + 'static {
        /// Whether this is a batch handler.
        const BATCH: bool;

        /// What the handler takes its payload as, for the service's description.
        const PAYLOAD: PayloadInfo;

        /// The handler inside `layer`; a batch handler takes none (the app checks that
        /// `layer` is no layer before it asks).
        type Layered<L: Layer>: Endpoint;

        /// Wraps the handler in `layer`.
        fn with_layer<L: Layer>(self, layer: L) -> Self::Layered<L>;
    }

    /// How the dispatch engine runs a mounted handler. Not for implementing by hand.
    pub trait Endpoint: Send + Sync + Sized + 'static {
        /// Checks once at startup that every extractor can work (state present, ...).
        fn check(&self, cx: &Context) -> Result<(), Error>;

        /// Runs the mount until shutdown or until the subscription ends.
        fn drive<S: Subscriber>(
            self: Arc<Self>,
            subscriber: S,
            run: Run,
        ) -> impl Future<Output = Result<(), Error>> + Send;
    }

    /// A single-delivery handler function, ready for the dispatch engine.
    pub struct OneFn<F, A> {
        pub(crate) f: F,
        pub(crate) _args: PhantomData<fn() -> A>,
    }

    /// A batch handler function, ready for the dispatch engine.
    pub struct BatchFn<F, A> {
        pub(crate) f: F,
        pub(crate) _args: PhantomData<fn() -> A>,
    }

    /// What a mounted handler takes its payload as: its format and its type's name.
    #[derive(Clone, Copy, Debug)]
    pub struct PayloadInfo {
        pub(crate) format: Option<PayloadFormat>,
        pub(crate) type_name: fn() -> &'static str,
    }

    impl PayloadInfo {
        pub(crate) const fn of<P: FromPayload>() -> Self {
            PayloadInfo {
                format: P::FORMAT,
                type_name: std::any::type_name::<P>,
            }
        }
    }

    /// A single-delivery handler inside its layers.
    pub struct WithLayer<E, L> {
        pub(crate) endpoint: E,
        pub(crate) layer: L,
    }
}

pub(crate) use sealed::{
    BatchFn, Batched, Endpoint, OneFn, PayloadInfo, Single, Unlayered, WithLayer,
};

/// Why a handler could not be called for a delivery.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Extract(#[from] Rejection),
}

/// A handler that takes one delivery.
pub(crate) trait CallOne: Send + Sync + 'static {
    type Payload: FromPayload;

    /// Decodes the handler's arguments and gives its run, not yet started (with the
    /// mount's layers around it), which yields the outcome or the handler's error.
    fn call<'a>(
        &'a self,
        delivery: &'a Delivery,
        cx: &'a Context,
    ) -> Result<impl Future<Output = Result<Outcome, BoxError>> + Send + 'a, Refusal>;
    fn check_extractors(cx: &Context) -> Result<(), Error>;
}

impl<E: CallOne, L: Layer> CallOne for WithLayer<E, L> {
    type Payload = E::Payload;

    fn call<'a>(
        &'a self,
        delivery: &'a Delivery,
        cx: &'a Context,
    ) -> Result<impl Future<Output = Result<Outcome, BoxError>> + Send + 'a, Refusal> {
        let run = self.endpoint.call(delivery, cx)?;
        Ok(self.layer.call(delivery, run))
    }

    fn check_extractors(cx: &Context) -> Result<(), Error> {
        E::check_extractors(cx)
    }
}

impl<E: CallOne, L: Layer> Endpoint for WithLayer<E, L> {
    fn check(&self, cx: &Context) -> Result<(), Error> {
        E::check_extractors(cx)
    }

    fn drive<S: Subscriber>(
        self: Arc<Self>,
        subscriber: S,
        run: Run,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        dispatch::drive_one(self, subscriber, run)
    }
}

/// A handler that takes a batch of decoded payloads.
pub(crate) trait CallBatch: Send + Sync + 'static {
    type Payload: FromPayload;
    type Output: IntoBatchOutcome;
    type Future: Future<Output = Self::Output> + Send + 'static;

    fn call(&self, batch: Batch<Self::Payload>, cx: &Context) -> Result<Self::Future, Rejection>;
    fn check_extractors(cx: &Context) -> Result<(), Error>;
}

impl<F, A> Handler<Single<A>> for F
where
    F: Clone + Send + Sync + 'static,
    OneFn<F, A>: CallOne,
    A: 'static,
{
    type Endpoint = OneFn<F, A>;

    fn into_endpoint(self) -> OneFn<F, A> {
        OneFn {
            f: self,
            _args: PhantomData,
        }
    }
}

impl<F, A> Handler<Batched<A>> for F
where
    F: Clone + Send + Sync + 'static,
    BatchFn<F, A>: CallBatch,
    A: 'static,
{
    type Endpoint = BatchFn<F, A>;

    fn into_endpoint(self) -> BatchFn<F, A> {
        BatchFn {
            f: self,
            _args: PhantomData,
        }
    }
}

/// A single-delivery handler always runs inside its layers (none is `Identity`).
impl<F, A> Unlayered for OneFn<F, A>
where
    OneFn<F, A>: CallOne,
    A: 'static,
{
    const BATCH: bool = false;

    const PAYLOAD: PayloadInfo = PayloadInfo::of::<<Self as CallOne>::Payload>();

    type Layered<L: Layer> = WithLayer<Self, L>;

    fn with_layer<L: Layer>(self, layer: L) -> WithLayer<Self, L> {
        WithLayer {
            endpoint: self,
            layer,
        }
    }
}

impl<F, A> Unlayered for BatchFn<F, A>
where
    BatchFn<F, A>: CallBatch,
    A: 'static,
{
    const BATCH: bool = true;

    const PAYLOAD: PayloadInfo = PayloadInfo::of::<<Self as CallBatch>::Payload>();

    type Layered<L: Layer> = Self;

    fn with_layer<L: Layer>(self, _layer: L) -> Self {
        self
    }
}

impl<F, A> Endpoint for BatchFn<F, A>
where
    BatchFn<F, A>: CallBatch,
    A: 'static,
{
    fn check(&self, cx: &Context) -> Result<(), Error> {
        <Self as CallBatch>::check_extractors(cx)
    }

    fn drive<S: Subscriber>(
        self: Arc<Self>,
        subscriber: S,
        run: Run,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        dispatch::drive_batch(self, subscriber, run)
    }
}

macro_rules! impl_handler {
    ($($extractor:ident),*) => {
        impl<F, Fut, P, $($extractor,)*> CallOne for OneFn<F, (P, $($extractor,)*)>
        where
            F: Fn(P, $($extractor,)*) -> Fut + Send + Sync + 'static,
            Fut: Future + Send + 'static,
            Fut::Output: IntoReply,
            P: FromPayload,
            $($extractor: FromDelivery,)*
        {
            type Payload = P;

            #[allow(non_snake_case, unused_variables)]
            fn call<'a>(
                &'a self,
                delivery: &'a Delivery,
                cx: &'a Context,
            ) -> Result<impl Future<Output = Result<Outcome, BoxError>> + Send + 'a, Refusal> {
                let payload = crate::payload::decode::<P>(delivery, cx)?;
                $(let $extractor = $extractor::from_delivery(delivery, cx)?;)*
                let run = (self.f)(payload, $($extractor,)*);
                // `into_reply` is user code too (a custom `IntoOutcome`): it runs inside
                // the run, where panics are caught. The messages it returns are published
                // inside the run too, so layers and the timeout see them as part of it.
                Ok(<Fut::Output as IntoReply>::run_and_publish(run, delivery, cx))
            }

            #[allow(unused_variables)]
            fn check_extractors(cx: &Context) -> Result<(), Error> {
                $($extractor::check(cx)?;)*
                Ok(())
            }
        }

        impl<F, Fut, P, $($extractor,)*> CallBatch for BatchFn<F, (Batch<P>, $($extractor,)*)>
        where
            F: Fn(Batch<P>, $($extractor,)*) -> Fut + Send + Sync + 'static,
            Fut: Future + Send + 'static,
            Fut::Output: IntoBatchOutcome,
            P: FromPayload,
            $($extractor: FromContext,)*
        {
            type Payload = P;
            type Output = Fut::Output;
            type Future = Fut;

            #[allow(non_snake_case, unused_variables)]
            fn call(&self, batch: Batch<P>, cx: &Context) -> Result<Fut, Rejection> {
                $(let $extractor = $extractor::from_context(cx)?;)*
                Ok((self.f)(batch, $($extractor,)*))
            }

            #[allow(unused_variables)]
            fn check_extractors(cx: &Context) -> Result<(), Error> {
                $($extractor::check(cx)?;)*
                Ok(())
            }
        }
    };
}

impl_handler!();
impl_handler!(E1);
impl_handler!(E1, E2);
impl_handler!(E1, E2, E3);
impl_handler!(E1, E2, E3, E4);
impl_handler!(E1, E2, E3, E4, E5);
impl_handler!(E1, E2, E3, E4, E5, E6);
impl_handler!(E1, E2, E3, E4, E5, E6, E7);
impl_handler!(E1, E2, E3, E4, E5, E6, E7, E8);
