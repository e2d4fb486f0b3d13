//! A mount site's settings: dispatch mode, batch size, window and failure policy.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::layer::{Identity, Layer, Stack};
use crate::policy::{Backoff, FailurePolicy, OnError};
use crate::transport::Publisher;
use crate::transport::SharedPublisher;

/// How a mount runs its deliveries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dispatch {
    /// One at a time, in the order received.
    Sequential,
    /// Up to `n` at once, finishing in any order.
    Workers(usize),
    /// `n` lanes; a delivery goes to the lane its partition key hashes to, and each lane
    /// runs its deliveries one at a time in arrival order.
    Lanes(usize),
    /// `workers` workers; each key runs one delivery at a time in arrival order, on
    /// whichever worker is free. At most `read_ahead` deliveries are held.
    AnyWorker {
        /// How many handlers run at once.
        workers: usize,
        /// The most deliveries held at once: running, or waiting for their key's turn.
        read_ahead: usize,
    },
}

/// Where a mount's dispatch settings stand, as a type: [`MountOptions`] offers only what
/// fits after them, so a mode that means nothing is a compile error, not a startup one.
///
/// `m.workers(n)` is offered on a [`Sequential`] mount, `.by_key()` after it
/// ([`Workers`]), `.any_worker()` after that ([`Keyed`]), and `.read_ahead(r)` only on
/// an [`AnyWorker`] mount. A mode chosen at run time is set from a
/// [`Dispatch`](crate::Dispatch) value with
/// [`with_dispatch`](crate::MountOptions::with_dispatch) ([`Chosen`](crate::mode::Chosen)).
///
/// ```compile_fail,E0599
/// # use conveyor::MountOptions;
/// // by_key() spreads keys over workers: a mount without them already keeps every key's order.
/// MountOptions::default().by_key();
/// ```
///
/// ```compile_fail,E0599
/// # use conveyor::MountOptions;
/// // any_worker() unties keys from lanes: without keys it means nothing.
/// MountOptions::default().workers(2).any_worker();
/// ```
///
/// ```compile_fail,E0599
/// # use conveyor::MountOptions;
/// // read_ahead sizes any_worker()'s window only.
/// MountOptions::default().workers(2).read_ahead(8);
/// ```
pub mod mode {
    /// One delivery at a time: the default. Offers [`workers`](crate::MountOptions::workers).
    #[derive(Clone, Copy, Debug)]
    pub struct Sequential;
    /// After `workers(n)`. Offers [`by_key`](crate::MountOptions::by_key).
    #[derive(Clone, Copy, Debug)]
    pub struct Workers;
    /// After `workers(n).by_key()`: ordered lanes. Offers
    /// [`any_worker`](crate::MountOptions::any_worker).
    #[derive(Clone, Copy, Debug)]
    pub struct Keyed;
    /// After `workers(n).by_key().any_worker()`. Offers
    /// [`read_ahead`](crate::MountOptions::read_ahead).
    #[derive(Clone, Copy, Debug)]
    pub struct AnyWorker;
    /// After [`with_dispatch`](crate::MountOptions::with_dispatch): a mode chosen at run
    /// time, which offers no further dispatch setting.
    #[derive(Clone, Copy, Debug)]
    pub struct Chosen;
}

use mode::{AnyWorker, Keyed, Sequential, Workers};

/// The settings of one mount site, built in the closure given to
/// [`App::mount`](crate::App::mount). `L` is the layers of this mount
/// ([`layer`](Self::layer)); none by default. `D` is where its dispatch settings stand
/// (see [`mode`]): it decides which of `workers`, `by_key`, `any_worker` and `read_ahead`
/// are offered.
///
/// ```
/// use std::time::Duration;
/// use conveyor::{Backoff, Dispatch, MountOptions};
///
/// let lanes = MountOptions::default().workers(4).by_key();
/// assert_eq!(lanes.dispatch(), Dispatch::Lanes(4));
///
/// let spread = MountOptions::default().workers(16).by_key().any_worker();
/// assert_eq!(spread.dispatch(), Dispatch::AnyWorker { workers: 16, read_ahead: 64 });
///
/// let careful = MountOptions::default()
///     .retry_after(Backoff::fixed(Duration::from_secs(5)))
///     .max_attempts(3);
/// assert_eq!(careful.dispatch(), Dispatch::Sequential);
/// ```
#[derive(Clone, Debug)]
pub struct MountOptions<L = Identity, D = Sequential> {
    workers: Option<usize>,
    /// `by_key()` was asked for (after `workers(n)`).
    keyed: bool,
    /// `any_worker()` was asked for (after `by_key()`).
    any_worker: bool,
    read_ahead: Option<usize>,
    batch_size: Option<usize>,
    policy: FailurePolicy,
    timeout: Option<Duration>,
    publish_to: Option<Arc<str>>,
    publish_via: Option<SharedPublisher>,
    any_content_type: bool,
    #[cfg(feature = "schemars")]
    schemas: Schemas,
    layer: L,
    mode: PhantomData<D>,
}

/// The schemas a mount documents for the app's AsyncAPI document.
#[cfg(feature = "schemars")]
#[derive(Clone, Copy, Debug, Default)]
struct Schemas {
    payload: Option<SchemaFn>,
    output: Option<(SchemaFn, NameFn)>,
}

/// Gives a type's schema (a reference to it, for a named type) from a generator.
#[cfg(feature = "schemars")]
pub(crate) type SchemaFn = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

/// Gives a type's schema name.
#[cfg(feature = "schemars")]
pub(crate) type NameFn = fn() -> std::borrow::Cow<'static, str>;

#[cfg(feature = "schemars")]
fn subschema<T: schemars::JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
) -> schemars::Schema {
    generator.subschema_for::<T>()
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            workers: None,
            keyed: false,
            any_worker: false,
            read_ahead: None,
            batch_size: None,
            policy: FailurePolicy::default(),
            timeout: None,
            publish_to: None,
            publish_via: None,
            any_content_type: false,
            #[cfg(feature = "schemars")]
            schemas: Schemas::default(),
            layer: Identity,
            mode: PhantomData,
        }
    }
}

/// The batch size when a batch handler's mount names none.
pub const DEFAULT_BATCH_SIZE: usize = 10;

/// How many deliveries may wait in a lane behind the one it is running.
pub(crate) const LANE_BUFFER: usize = 1;

impl<L, D> MountOptions<L, D> {
    /// Wraps this mount's handler in `layer` (see [`Layer`]): inside the layers of
    /// [`App::layer`](crate::App::layer), and around those this mount was given before.
    /// A batch mount takes no layer: it is a startup error.
    ///
    /// ```
    /// use conveyor::{Dispatch, Identity, MountOptions};
    ///
    /// // Any `conveyor::Layer`; `Identity` is the one that does nothing.
    /// let layered = MountOptions::default().workers(4).layer(Identity);
    /// assert_eq!(layered.dispatch(), Dispatch::Workers(4));
    /// ```
    pub fn layer<Outer: Layer>(self, layer: Outer) -> MountOptions<Stack<Outer, L>, D> {
        let (options, inner) = self.swap::<Identity, D>(Identity);
        options.swap(Stack::new(layer, inner)).0
    }

    /// The settings and the layers, apart. The dispatch mode stays in the settings' own
    /// fields: the core reads it from [`dispatch`](Self::dispatch).
    pub(crate) fn into_parts(self) -> (MountOptions, L) {
        self.swap(Identity)
    }

    /// The same settings in mode `E`.
    fn into_mode<E>(self) -> MountOptions<L, E> {
        let (options, layer) = self.swap::<Identity, E>(Identity);
        options.swap(layer).0
    }

    /// The same settings with `layer`, in mode `E`, and the layers they had.
    fn swap<M, E>(self, layer: M) -> (MountOptions<M, E>, L) {
        let options = MountOptions {
            workers: self.workers,
            keyed: self.keyed,
            any_worker: self.any_worker,
            read_ahead: self.read_ahead,
            batch_size: self.batch_size,
            policy: self.policy,
            timeout: self.timeout,
            publish_to: self.publish_to,
            publish_via: self.publish_via,
            any_content_type: self.any_content_type,
            #[cfg(feature = "schemars")]
            schemas: self.schemas,
            layer,
            mode: PhantomData,
        };
        (options, self.layer)
    }

    /// What does not fit together, as a startup error's text.
    pub(crate) fn conflict(&self) -> Option<String> {
        (self.timeout == Some(Duration::ZERO)).then(|| {
            "timeout(0) would cancel every handler before it runs; use a longer one".into()
        })
    }

    /// The most deliveries a batch handler gets at once (default
    /// [`DEFAULT_BATCH_SIZE`]). Batches are never empty and often smaller.
    pub fn batch(mut self, size: usize) -> Self {
        self.batch_size = Some(size);
        self
    }

    /// Cancels a handler still running `limit` after it started (a batch handler's
    /// call too), and treats the run as a handler error: the failure policy decides
    /// what happens to the delivery, and the reason says it timed out. Each attempt gets
    /// the whole `limit`. A zero `limit` is a startup error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use conveyor::MountOptions;
    ///
    /// let bounded = MountOptions::default().workers(8).timeout(Duration::from_secs(30));
    /// assert_eq!(bounded.handler_timeout(), Some(Duration::from_secs(30)));
    /// ```
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// Where the messages the handler returns go (see [`crate::output`]): to
    /// `destination` (a queue, or what the broker's publisher takes), through the
    /// publisher of the broker this mount consumes from, unless
    /// [`publish_via`](Self::publish_via) names another. Each is taken by the broker
    /// before the delivery is acked. An [`Output::to`](crate::Output::to) goes to its own
    /// destination instead. Not for a batch handler, which returns outcomes only.
    ///
    /// ```
    /// use conveyor::MountOptions;
    ///
    /// let options = MountOptions::default().workers(4).by_key().publish_to("invoices");
    /// assert_eq!(options.output_destination(), Some("invoices"));
    /// ```
    pub fn publish_to(mut self, destination: impl Into<Arc<str>>) -> Self {
        self.publish_to = Some(destination.into());
        self
    }

    /// Publishes the handler's messages through `publisher` (another broker's, say, to
    /// pass work from one transport to another) instead of the mount's own broker.
    pub fn publish_via(mut self, publisher: impl Publisher + 'static) -> Self {
        self.publish_via = Some(SharedPublisher::new(publisher));
        self
    }

    /// Decodes every payload whatever content type it is labelled with: for producers
    /// that label a binary format wrongly (`application/octet-stream`, say). Without it, a
    /// payload type that checks its format (`MsgPack<T>`, `Cbor<T>`; see
    /// [`FromPayload::FORMAT`](crate::FromPayload::FORMAT)) rejects a delivery labelled
    /// with another one before decoding it.
    ///
    /// ```
    /// use conveyor::MountOptions;
    ///
    /// let lenient = MountOptions::default().any_content_type();
    /// assert!(lenient.takes_any_content_type());
    /// assert!(!MountOptions::default().takes_any_content_type());
    /// ```
    pub fn any_content_type(mut self) -> Self {
        self.any_content_type = true;
        self
    }

    /// Documents the payload this mount takes as `T`'s JSON Schema, in the app's AsyncAPI
    /// document ([`App::asyncapi`](crate::App::asyncapi); feature `schemars`). Name the
    /// type the handler decodes: `Order` for a handler taking `Json<Order>`.
    ///
    /// ```
    /// use conveyor::{App, Json, MemoryBroker};
    ///
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct Order { id: u64 }
    ///
    /// async fn place(Json(order): Json<Order>) {}
    ///
    /// let broker = MemoryBroker::new();
    /// let app = App::new("shop").mount(broker.queue("orders"), place, |m| m.payload_schema::<Order>());
    /// let document = app.asyncapi().into_json();
    /// assert_eq!(
    ///     document["channels"]["orders"]["messages"]["Order"]["payload"]["$ref"],
    ///     "#/components/schemas/Order"
    /// );
    /// assert_eq!(document["components"]["schemas"]["Order"]["required"][0], "id");
    /// ```
    #[cfg(feature = "schemars")]
    pub fn payload_schema<T: schemars::JsonSchema>(mut self) -> Self {
        self.schemas.payload = Some(subschema::<T>);
        self
    }

    /// Documents the messages the handler returns (to its
    /// [`publish_to`](Self::publish_to) destination) as `T`'s JSON Schema, in the app's
    /// AsyncAPI document (feature `schemars`).
    #[cfg(feature = "schemars")]
    pub fn output_schema<T: schemars::JsonSchema>(mut self) -> Self {
        self.schemas.output = Some((subschema::<T>, T::schema_name));
        self
    }

    #[cfg(feature = "schemars")]
    pub(crate) fn payload_schema_fn(&self) -> Option<SchemaFn> {
        self.schemas.payload
    }

    #[cfg(feature = "schemars")]
    pub(crate) fn output_schema_fn(&self) -> Option<(SchemaFn, NameFn)> {
        self.schemas.output
    }

    /// Whether the outputs go through another broker's publisher
    /// ([`publish_via`](Self::publish_via)).
    pub(crate) fn publishes_via_another(&self) -> bool {
        self.publish_via.is_some()
    }

    /// Whether [`any_content_type`](Self::any_content_type) was set.
    pub fn takes_any_content_type(&self) -> bool {
        self.any_content_type
    }

    /// The [`publish_to`](Self::publish_to) destination, if one was set.
    pub fn output_destination(&self) -> Option<&str> {
        self.publish_to.as_deref()
    }

    /// Whether `publish_to` or `publish_via` was set.
    pub(crate) fn publishes(&self) -> bool {
        self.publish_to.is_some() || self.publish_via.is_some()
    }

    /// Where the handler's outputs go, given the publisher of the mount's own broker.
    pub(crate) fn route(&self, own: Option<SharedPublisher>) -> crate::route::Route {
        crate::route::Route {
            own,
            via: self.publish_via.clone(),
            destination: self.publish_to.clone(),
        }
    }

    /// The handler timeout set with [`timeout`](Self::timeout).
    pub fn handler_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// On handler error, puts the delivery back on the queue at once.
    pub fn retry(mut self) -> Self {
        self.policy.on_error = OnError::Retry;
        self
    }

    /// On handler error, puts the delivery back after the backoff's delay.
    pub fn retry_after(mut self, backoff: Backoff) -> Self {
        self.policy.on_error = OnError::RetryAfter(backoff);
        self
    }

    /// On handler error, rejects the delivery at once (dead-letters it where the queue
    /// has a dead-letter queue).
    pub fn reject_on_error(mut self) -> Self {
        self.policy.on_error = OnError::Reject;
        self
    }

    /// Rejects a delivery whose attempt number `n` fails, or asks for a retry
    /// ([`Outcome::Retry`](crate::Outcome::Retry), `RetryAfter`), whatever the policy
    /// says. So a message that keeps failing always ends in a reject.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.policy.max_attempts = Some(n);
        self
    }

    /// Never gives up: retries as the policy says, however many attempts fail.
    pub fn unlimited_attempts(mut self) -> Self {
        self.policy.max_attempts = None;
        self
    }

    /// The dispatch mode's name in spans and metrics: `sequential`, `workers`, `lanes`,
    /// `any_worker` or `batch` (a batch handler's mount, with or without `batch(n)`).
    pub(crate) fn dispatch_name(&self, batch_handler: bool) -> &'static str {
        if batch_handler || self.batch_size.is_some() {
            return "batch";
        }
        match self.dispatch() {
            Dispatch::Sequential => "sequential",
            Dispatch::Workers(_) => "workers",
            Dispatch::Lanes(_) => "lanes",
            Dispatch::AnyWorker { .. } => "any_worker",
        }
    }

    /// The dispatch mode.
    pub fn dispatch(&self) -> Dispatch {
        match (self.workers, self.keyed, self.any_worker) {
            (None, ..) => Dispatch::Sequential,
            (Some(n), false, _) => Dispatch::Workers(n),
            (Some(n), true, false) => Dispatch::Lanes(n),
            (Some(n), true, true) => Dispatch::AnyWorker {
                workers: n,
                read_ahead: self
                    .read_ahead
                    .unwrap_or(n.saturating_mul(crate::dispatch::DEFAULT_READ_AHEAD_PER_WORKER)),
            },
        }
    }

    /// The batch size set with [`batch`](Self::batch).
    pub fn batch_size(&self) -> Option<usize> {
        self.batch_size
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }

    /// How many deliveries the mount can hold at once: running, queued in lanes, or in the
    /// dispatcher's hand.
    pub(crate) fn max_in_flight(&self) -> usize {
        match (self.batch_size, self.dispatch()) {
            (Some(size), _) => size,
            (None, Dispatch::Sequential) => 1,
            (None, Dispatch::Workers(n)) => n,
            (None, Dispatch::Lanes(n)) => n.saturating_mul(1 + LANE_BUFFER).saturating_add(1),
            (None, Dispatch::AnyWorker { read_ahead, .. }) => read_ahead,
        }
    }
}

impl<L> MountOptions<L, Sequential> {
    /// Sets the dispatch mode from a value, for a mode chosen at run time (from
    /// configuration, say) where the type of each branch of `workers(n)`, `by_key()` and
    /// `any_worker()` would differ. The result offers none of those any more.
    ///
    /// ```
    /// use conveyor::{Dispatch, MountOptions};
    ///
    /// let ordered = true; // from the service's configuration
    /// let mode = if ordered { Dispatch::Lanes(4) } else { Dispatch::Workers(4) };
    /// let options = MountOptions::default().with_dispatch(mode).max_attempts(3);
    /// assert_eq!(options.dispatch(), Dispatch::Lanes(4));
    /// ```
    pub fn with_dispatch(mut self, dispatch: Dispatch) -> MountOptions<L, mode::Chosen> {
        (self.workers, self.keyed, self.any_worker, self.read_ahead) = match dispatch {
            Dispatch::Sequential => (None, false, false, None),
            Dispatch::Workers(n) => (Some(n), false, false, None),
            Dispatch::Lanes(n) => (Some(n), true, false, None),
            Dispatch::AnyWorker {
                workers,
                read_ahead,
            } => (Some(workers), true, true, Some(read_ahead)),
        };
        self.into_mode()
    }

    /// Runs up to `n` handlers at once, finishing in any order. While `n` are in flight
    /// the subscription reads nothing further. A retry goes back to the broker. Follow
    /// with [`by_key`](Self::by_key) for ordered lanes. At most
    /// [`MAX_WORKERS`](crate::dispatch::MAX_WORKERS).
    pub fn workers(mut self, n: usize) -> MountOptions<L, Workers> {
        self.workers = Some(n);
        self.into_mode()
    }
}

impl<L> MountOptions<L, Workers> {
    /// Turns `workers(n)` into `n` ordered lanes keyed by the partition key: one key never
    /// spreads over two lanes, a lane runs its deliveries one at a time in arrival order,
    /// and deliveries without a key rotate over the lanes. Offered only after `workers(n)`
    /// (a sequential mount already keeps every key's order).
    ///
    /// A lane retries a failed delivery in place, after its backoff, before it runs the
    /// next one, so each key keeps its order across retries; meanwhile the lane's other
    /// keys wait.
    ///
    /// The lanes run on the mount's own task: their handlers wait side by side (I/O,
    /// timers, backoffs), and a handler that finishes without waiting costs no hand-over
    /// to another task. What a handler computes between its awaits runs on one thread at
    /// a time, so CPU-heavy work belongs in `tokio::task::spawn_blocking`, or in
    /// [`any_worker`](MountOptions::any_worker), whose workers are tasks of their own.
    pub fn by_key(mut self) -> MountOptions<L, Keyed> {
        self.keyed = true;
        self.into_mode()
    }
}

impl<L> MountOptions<L, Keyed> {
    /// Unties keys from lanes: under `workers(n).by_key().any_worker()` a free worker
    /// takes the oldest delivery held whose key has nothing running. Each key still runs
    /// one delivery at a time, in arrival order, retries in place included; but a busy
    /// key no longer holds up the other keys a hash put on its lane, so `n` workers stay
    /// busy as long as `n` keys have work.
    ///
    /// The mount reads ahead up to [`read_ahead`](Self::read_ahead) deliveries (default
    /// [`DEFAULT_READ_AHEAD_PER_WORKER`](crate::dispatch::DEFAULT_READ_AHEAD_PER_WORKER)
    /// per worker) to find keys to run; one key may hold at most `read_ahead - n` of them,
    /// which leaves room for a delivery of each other worker's key. The queue's order
    /// still rules: when the next delivery's key holds all it may, the mount reads on
    /// only once that key has run one. Choose lanes instead when a key's lane must be
    /// predictable, for example to keep per-lane state in the handler. Offered only after
    /// `by_key()`.
    ///
    /// Deliveries waiting for their key's turn are held by the broker as unsettled, so
    /// they count against its limits: with slow handlers and a key that holds many, the
    /// last may wait long, and RabbitMQ closes a channel whose delivery stays unacked past
    /// its `consumer_timeout` (30 minutes by default). Keep `read_ahead` in proportion.
    pub fn any_worker(mut self) -> MountOptions<L, AnyWorker> {
        self.any_worker = true;
        self.into_mode()
    }
}

impl<L> MountOptions<L, AnyWorker> {
    /// How many deliveries an `any_worker()` mount holds at once: running, or waiting for
    /// their key's turn. At least `n` (the workers); more finds more distinct keys to run
    /// at the cost of more unsettled deliveries held. Offered only after `any_worker()`;
    /// below `n`, it is a startup error.
    pub fn read_ahead(mut self, deliveries: usize) -> Self {
        self.read_ahead = Some(deliveries);
        self
    }
}
