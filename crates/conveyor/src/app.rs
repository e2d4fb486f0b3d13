//! The app: owns mounts and shared state, starts subscriptions, shuts down gracefully.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::asyncapi::QueueDescription;
use crate::dispatch::{MAX_WORKERS, Phase, Run, Shutdown};
use crate::error::{Error, Report};
use crate::extract::Context;
use crate::handler::{Endpoint, Handler, Unlayered};
use crate::health::{Health, MountHealth, MountStatus};
use crate::lanes_view::MountLanes;
use crate::layer::{Identity, Layer, Stack};
use crate::mount::{Dispatch, MountOptions};
use crate::state::StateMap;
use crate::transport::{Broker, ConnectionHealth, Source, SubscribeSettings, Subscriber};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type MountTask = BoxFuture<Result<(), Error>>;
type Start = Box<dyn FnOnce(Run) -> BoxFuture<Result<MountTask, Error>> + Send>;
type Check = Box<dyn Fn(&Context) -> Result<(), Error> + Send>;
type Close = Box<dyn FnOnce() -> BoxFuture<Result<(), Error>> + Send>;
type Connections = Box<dyn Fn() -> Vec<ConnectionHealth> + Send + Sync>;

/// The default time in-flight handlers get to finish at shutdown.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// A service: handlers mounted on queues, and the state they share. `L` is the layers
/// every mount's handler runs in ([`App::layer`]); none by default.
///
/// `run` starts every subscription (failing at once if one cannot start), runs until
/// SIGINT or SIGTERM, then shuts down gracefully: it stops receiving, gives in-flight
/// handlers up to the shutdown timeout to finish and settles them, and releases at once
/// every delivery that was received but not started.
///
/// ```
/// use conveyor::{App, Json, MemoryBroker, Publisher};
///
/// async fn greet(Json(name): Json<String>) {
///     println!("hello, {name}");
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), conveyor::Error> {
/// let broker = MemoryBroker::new();
/// broker.publish_json("greetings", "world").await?;
/// let idle = broker.clone();
/// App::new("greeter")
///     .mount(broker.queue("greetings"), greet, |m| m)
///     .run_until(async move { idle.wait_idle().await })
///     .await
/// # }
/// ```
pub struct App<L = Identity> {
    name: String,
    /// The service's version, for its AsyncAPI document.
    version: String,
    state: StateMap,
    mounts: Vec<Mount>,
    brokers: Vec<Close>,
    /// Each broker's connections, for the health.
    connections: Vec<Connections>,
    shutdown_timeout: Duration,
    /// The layers every mount added from now on is wrapped in.
    layer: L,
    /// Set when a layer came after a mount, which it would not wrap.
    misplaced_layer: bool,
}

struct Mount {
    queue: String,
    /// The source's `messaging.system`, for the delivery spans.
    system: &'static str,
    options: MountOptions,
    batch_handler: bool,
    /// The mount has layers (its own or the app's).
    layered: bool,
    /// Where the handler's outputs go.
    route: crate::route::Route,
    /// What the handler takes its payload as, for the AsyncAPI document.
    payload: crate::handler::PayloadInfo,
    /// How the transport describes the queue, and the `publish_to` destination.
    described: (QueueDescription, Option<QueueDescription>),
    check: Check,
    start: Start,
}

impl App {
    /// An app with no mounts; `name` appears in its logs.
    pub fn new(name: impl Into<String>) -> Self {
        App {
            name: name.into(),
            version: String::from("0.0.0"),
            state: StateMap::default(),
            mounts: Vec::new(),
            brokers: Vec::new(),
            connections: Vec::new(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            layer: Identity,
            misplaced_layer: false,
        }
    }
}

impl<L: Layer + Clone> App<L> {
    /// Wraps the handler of every mount in `layer` (see [`Layer`]), around the layers
    /// given before and those of each mount. It must come before the mounts: a layer
    /// added after a mount is a startup error, as it would not wrap it. A batch mount
    /// takes no layer: an app with layers and a batch handler fails to start.
    ///
    /// Each mount gets its own clone of `layer`: keep state that the mounts must share
    /// (a store of seen ids, say) behind an `Arc`. The app's type records its layers
    /// (`App<Stack<Outer, L>>`), so that they compile into each handler's future.
    ///
    /// ```
    /// # use conveyor::{App, Identity, Json, MemoryBroker};
    /// # async fn handle(Json(n): Json<u64>) {}
    /// let broker = MemoryBroker::new();
    /// let app = App::new("orders")
    ///     .layer(Identity) // say, deduplication or an audit log
    ///     .mount(broker.queue("orders"), handle, |m| m);
    /// ```
    pub fn layer<Outer: Layer + Clone>(self, layer: Outer) -> App<Stack<Outer, L>> {
        App {
            misplaced_layer: self.misplaced_layer || !self.mounts.is_empty(),
            name: self.name,
            version: self.version,
            state: self.state,
            mounts: self.mounts,
            brokers: self.brokers,
            connections: self.connections,
            shutdown_timeout: self.shutdown_timeout,
            layer: Stack::new(layer, self.layer),
        }
    }

    /// Gives the app a broker to own: it is closed at the end of shutdown, once every
    /// mount has stopped and settled its deliveries, and its connections show in
    /// [`RunningApp::health`]. Sources and publishers hold their own handles, so the app
    /// needs it only for these.
    ///
    /// ```
    /// # use conveyor::{App, Json, MemoryBroker};
    /// # async fn handle(Json(n): Json<u64>) {}
    /// let broker = MemoryBroker::new();
    /// let app = App::new("orders")
    ///     .broker(broker.clone())
    ///     .mount(broker.queue("orders"), handle, |m| m);
    /// ```
    pub fn broker<B: Broker>(mut self, broker: B) -> Self {
        let watched = broker.clone();
        self.connections
            .push(Box::new(move || watched.connections()));
        self.brokers.push(Box::new(move || {
            Box::pin(async move { broker.close().await })
        }));
        self
    }

    /// The service's version, as its AsyncAPI document gives it (default `0.0.0`).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The AsyncAPI 3.0 document of this app: a channel per mounted queue and per
    /// `publish_to` destination, a receive or send operation for each, with content
    /// types, the partition key's header, the brokers' bindings, and each mount's
    /// dispatch mode and failure policy (see [`crate::asyncapi`]).
    pub fn asyncapi(&self) -> crate::asyncapi::Document {
        let mounts = self
            .mounts
            .iter()
            .map(|mount| crate::asyncapi::MountDescription {
                queue: &mount.queue,
                system: mount.system,
                options: &mount.options,
                payload: mount.payload,
                batch: mount.batch_handler,
                received: &mount.described.0,
                sent: mount.described.1.as_ref(),
            });
        crate::asyncapi::document(&self.name, &self.version, mounts)
    }

    /// Adds a shared value that handlers extract with [`State<T>`](crate::State). One
    /// value per type; a second of the same type replaces the first.
    pub fn with_state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// How long in-flight handlers get to finish at shutdown (default 30 s). Handlers
    /// still running then are cancelled and their deliveries released to the broker.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Mounts `handler` on `source`, with the settings `configure` makes from the
    /// defaults (sequential dispatch, the default failure policy).
    ///
    /// ```
    /// # use conveyor::{App, Json, MemoryBroker};
    /// # async fn handle(Json(n): Json<u64>) {}
    /// let broker = MemoryBroker::new();
    /// let app = App::new("orders")
    ///     .mount(broker.queue("orders.fifo"), handle, |m| m.workers(4).by_key());
    /// ```
    pub fn mount<S, H, Args, M, D>(
        mut self,
        source: S,
        handler: H,
        configure: impl FnOnce(MountOptions) -> MountOptions<M, D>,
    ) -> Self
    where
        S: Source,
        H: Handler<Args>,
        M: Layer,
    {
        let (options, layer) = configure(MountOptions::default()).into_parts();
        let layer = Stack::new(self.layer.clone(), layer);
        // No layer is `Identity` on both sides; anything else was asked for.
        let none = std::any::TypeId::of::<Identity>();
        let layered = std::any::TypeId::of::<L>() != none || std::any::TypeId::of::<M>() != none;
        let endpoint = Arc::new(handler.into_endpoint().with_layer(layer));
        let checked = endpoint.clone();
        let route = options.route(source.publisher());
        let queue = source.queue_name();
        let sent = options
            .output_destination()
            .filter(|_| !options.publishes_via_another())
            .map(|destination| source.describe(destination));
        let described = (source.describe(queue), sent);
        let mut settings = SubscribeSettings::new(options.max_in_flight());
        settings.batch_size = options.batch_size();
        self.mounts.push(Mount {
            queue: source.queue_name().to_string(),
            system: source.messaging_system(),
            batch_handler: <H::Endpoint as Unlayered>::BATCH,
            payload: <H::Endpoint as Unlayered>::PAYLOAD,
            described,
            layered,
            route,
            options,
            check: Box::new(move |cx| checked.check(cx)),
            start: Box::new(move |run| {
                Box::pin(async move {
                    let subscriber = source.subscribe(settings).await?;
                    run.status.follow(subscriber.connection());
                    run.status.follow_shards(subscriber.shards());
                    let mut ended = EndGuard(Some(run.status.clone()));
                    let task: MountTask = Box::pin(async move {
                        let result = endpoint.drive(subscriber, run).await;
                        ended.ended(result.as_ref().err().map(|error| Report(error).to_string()));
                        result
                    });
                    Ok(task)
                })
            }),
        });
        self
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully.
    ///
    /// # Errors
    ///
    /// As [`run_until`](Self::run_until).
    pub async fn run(self) -> Result<(), Error> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `signal` completes, then shuts down gracefully. Returns early with the
    /// error if a subscription cannot start or ends by itself.
    ///
    /// # Errors
    ///
    /// What [`start`](Self::start) fails with; a mount that ends by itself while the
    /// app runs ([`Error::SubscriptionEnded`], or its subscription's error); and what
    /// [`RunningApp::shutdown`] fails with.
    pub async fn run_until(self, signal: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let mut running = self.start().await?;
        let early = tokio::select! {
            () = signal => None,
            ended = running.mounts.join_next() => ended,
        };
        let result = match early {
            Some(Ok(Err(error))) => Err(error),
            Some(Err(join_error)) => Err(Error::MountTask(join_error.to_string())),
            Some(Ok(Ok(()))) | None => Ok(()),
        };
        if let Err(error) = &result {
            tracing::error!(app = running.name, error = %Report(error), "shutting down after a mount failed");
        }
        let shut = running.shutdown().await;
        result.and(shut)
    }

    /// Checks every mount, starts every subscription, and returns the running app. A
    /// mount that cannot work (bad settings, missing state) or a subscription that cannot
    /// start fails here with a clear error, and nothing is left running.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings that cannot work together, [`Error::MissingState`]
    /// for a handler whose `State<T>` the app does not have, and the transport's error
    /// for a subscription that cannot start (a missing queue, a refused login).
    pub async fn start(self) -> Result<RunningApp, Error> {
        if self.misplaced_layer {
            return Err(Error::config(
                "App::layer came after a mount, which it would not wrap; add layers before the mounts",
            ));
        }
        let state = Arc::new(self.state);
        let (stop, shutdown) = Shutdown::new();
        let mut starts = Vec::with_capacity(self.mounts.len());
        for mount in self.mounts {
            let cx = Context::new(mount.queue.as_str().into(), state.clone())
                .with_route(mount.route)
                .with_any_content_type(mount.options.takes_any_content_type());
            validate(&mount.queue, &mount.options, mount.batch_handler)?;
            if mount.batch_handler && mount.layered {
                return Err(Error::config(format!(
                    "mount on `{}`: a batch handler takes no layer (layers wrap one delivery's run); mount it in an app without App::layer, and without MountOptions::layer",
                    mount.queue
                )));
            }
            (mount.check)(&cx)?;
            let dispatch = mount.options.dispatch_name(mount.batch_handler);
            starts.push((mount.start, cx, mount.options, mount.system, dispatch));
        }
        let mut tasks = Vec::with_capacity(starts.len());
        let mut statuses = Vec::with_capacity(starts.len());
        for (start, cx, options, system, dispatch) in starts {
            let status = MountStatus::default();
            statuses.push((cx.queue().to_string(), status.clone()));
            // A keyed mount's lanes (or any-worker's workers), for its live view; lanes
            // have their own metric series too.
            let keyed = match (options.dispatch(), dispatch) {
                (Dispatch::Lanes(n), "lanes")
                | (Dispatch::AnyWorker { workers: n, .. }, "any_worker") => n,
                _ => 0,
            };
            let lanes = if dispatch == "lanes" { keyed } else { 0 };
            let metrics = crate::telemetry::MountMetrics::new(system, cx.queue(), dispatch, lanes);
            if keyed > 0 {
                status.lane_stats(keyed);
            }
            let run = Run {
                process_name: format!("process {}", cx.queue()).into(),
                cx,
                options,
                system,
                dispatch,
                metrics,
                status,
                shutdown: shutdown.clone(),
                max_hold: crate::dispatch::MAX_IN_PLACE_HOLD,
            };
            tasks.push(start(run).await?);
        }
        let mut mounts = JoinSet::new();
        for task in tasks {
            mounts.spawn(task);
        }
        tracing::info!(app = self.name, mounts = mounts.len(), "started");
        Ok(RunningApp {
            name: self.name,
            stop,
            mounts,
            statuses,
            brokers: self.brokers,
            connections: self.connections,
            shutdown_timeout: self.shutdown_timeout,
        })
    }
}

impl<L> fmt::Debug for App<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("App")
            .field("name", &self.name)
            .field("state", &self.state)
            .field(
                "mounts",
                &self.mounts.iter().map(|m| &m.queue).collect::<Vec<_>>(),
            )
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish()
    }
}

fn validate(queue: &str, options: &MountOptions, batch_handler: bool) -> Result<(), Error> {
    let bad = |what: String| Err(Error::config(format!("mount on `{queue}`: {what}")));
    if let Some(conflict) = options.conflict() {
        return bad(conflict);
    }
    match options.dispatch() {
        Dispatch::Workers(0) | Dispatch::Lanes(0) | Dispatch::AnyWorker { workers: 0, .. } => {
            return bad("workers(0) can run nothing; use at least 1".into());
        }
        Dispatch::Workers(n) | Dispatch::Lanes(n) | Dispatch::AnyWorker { workers: n, .. }
            if n > MAX_WORKERS =>
        {
            return bad(format!(
                "workers({n}) is over the most a mount runs, {MAX_WORKERS}"
            ));
        }
        Dispatch::AnyWorker {
            workers,
            read_ahead,
        } if read_ahead < workers => {
            return bad(format!(
                "read_ahead({read_ahead}) is below workers({workers}): some workers could never run; use at least {workers}"
            ));
        }
        Dispatch::Sequential => {}
        _ if batch_handler => {
            return bad("a batch handler runs one batch at a time; drop workers(..)".into());
        }
        _ => {}
    }
    if batch_handler && options.publishes() {
        return bad(
            "a batch handler returns outcomes, not messages: drop publish_to(..) and publish_via(..)"
                .into(),
        );
    }
    match options.batch_size() {
        Some(_) if !batch_handler => {
            bad("batch(..) needs a batch handler, whose first argument is `Batch<P>`".into())
        }
        Some(0) => bad("batch(0) can hold nothing; use at least 1".into()),
        _ => Ok(()),
    }
}

/// A started app. Shut it down with [`shutdown`](Self::shutdown); dropping it cancels
/// every mount at once, releasing their deliveries to the broker.
pub struct RunningApp {
    name: String,
    stop: watch::Sender<Phase>,
    mounts: JoinSet<Result<(), Error>>,
    /// Each mount's queue and status, in mount order, for [`RunningApp::health`].
    statuses: Vec<(String, MountStatus)>,
    brokers: Vec<Close>,
    connections: Vec<Connections>,
    shutdown_timeout: Duration,
}

impl RunningApp {
    /// Every mount's state now: running, reconnecting, draining, stopped or failed (with
    /// the error), and every connection of the brokers given with [`App::broker`].
    /// [`Health::is_live`] and [`Health::is_ready`] answer a liveness and a readiness
    /// probe.
    pub fn health(&self) -> Health {
        let shutting_down = *self.stop.borrow() != Phase::Running;
        Health {
            app: self.name.clone(),
            mounts: self
                .statuses
                .iter()
                .map(|(queue, status)| MountHealth {
                    queue: queue.clone(),
                    state: status.state(shutting_down),
                    shards: status.shards(),
                })
                .collect(),
            connections: self.connections.iter().flat_map(|of| of()).collect(),
        }
    }

    /// A live view of every keyed mount (`workers(n).by_key()`, with or without
    /// `any_worker()`): what each lane (or worker) runs and holds, the hottest partition
    /// keys, and how often the mount waited behind one key. Answers "why is this key
    /// slow?": a hot key's lane shows a long wait and a long-running delivery while the
    /// others idle. Other mounts are not listed.
    ///
    /// ```
    /// use conveyor::{App, Json, MemoryBroker};
    ///
    /// # async fn handle(Json(n): Json<u64>) {}
    /// # async fn f() -> Result<(), conveyor::Error> {
    /// let broker = MemoryBroker::new();
    /// let app = App::new("orders")
    ///     .mount(broker.queue("orders"), handle, |m| m.workers(4).by_key())
    ///     .start()
    ///     .await?;
    /// let view = app.lanes();
    /// assert_eq!(view[0].lanes.len(), 4);
    /// for hot in &view[0].hot_keys {
    ///     println!("{} (lane {:?}): {} of the recent sample", hot.key, hot.lane, hot.count);
    /// }
    /// app.shutdown().await
    /// # }
    /// ```
    pub fn lanes(&self) -> Vec<MountLanes> {
        self.statuses
            .iter()
            .filter_map(|(queue, status)| {
                status.lanes().map(|stats| {
                    let mut view = stats.snapshot(queue);
                    view.shards = status.shards();
                    view
                })
            })
            .collect()
    }

    /// Stops receiving now, without waiting: in-flight handlers go on and deliveries not
    /// yet started are released. [`shutdown`](Self::shutdown) then waits for the rest. Use
    /// it to drain a service (before a readiness probe fails, say) ahead of shutting down.
    pub fn stop_receiving(&self) {
        self.stop.send_if_modified(|phase| {
            let running = *phase == Phase::Running;
            if running {
                *phase = Phase::Draining;
            }
            running
        });
    }

    /// Stops receiving, lets in-flight handlers finish within the shutdown timeout and
    /// settles them, releases received-but-unstarted deliveries, closes the brokers given
    /// with [`App::broker`], then returns. Handlers still running at the timeout are
    /// cancelled and their deliveries released.
    ///
    /// # Errors
    ///
    /// The first error a mount ended with, or a broker's error while closing.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        tracing::info!(app = self.name, "shutting down");
        self.stop_receiving();
        let mut first_error = None;
        let drained =
            tokio::time::timeout(self.shutdown_timeout, self.join_mounts(&mut first_error)).await;
        if drained.is_err() {
            tracing::warn!(
                app = self.name,
                timeout = ?self.shutdown_timeout,
                "handlers still running at the shutdown timeout are cancelled; their messages go back to the broker"
            );
            // Every mount drops its running handlers (releasing their deliveries) and
            // ends; one that does not within the grace period is aborted.
            self.stop.send_replace(Phase::Cancelling);
            let ended =
                tokio::time::timeout(CANCEL_GRACE, self.join_mounts(&mut first_error)).await;
            if ended.is_err() {
                self.mounts.shutdown().await;
            }
        }
        for close in self.brokers.drain(..) {
            if let Err(error) = close().await {
                tracing::warn!(app = self.name, error = %Report(&error), "closing a broker failed");
                first_error.get_or_insert(error);
            }
        }
        tracing::info!(app = self.name, "stopped");
        first_error.map_or(Ok(()), Err)
    }
}

impl RunningApp {
    async fn join_mounts(&mut self, first_error: &mut Option<Error>) {
        while let Some(joined) = self.mounts.join_next().await {
            if let Ok(Err(error)) = joined {
                first_error.get_or_insert(error);
            }
        }
    }
}

/// Records how a mount's task ended; one dropped before it ended (it panicked, or was
/// aborted) shows as failed.
struct EndGuard(Option<MountStatus>);

impl EndGuard {
    fn ended(&mut self, error: Option<String>) {
        if let Some(status) = self.0.take() {
            status.ended(error);
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.ended(Some("the mount's task panicked or was aborted".to_string()));
    }
}

/// How long mounts get to drop their cancelled handlers before they are aborted.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

impl fmt::Debug for RunningApp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningApp")
            .field("name", &self.name)
            .field("mounts", &self.mounts.len())
            .finish()
    }
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
