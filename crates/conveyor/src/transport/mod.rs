//! The contract between the core and a transport.
//!
//! A transport provides three things: a [`Source`] (a queue a handler can be mounted on),
//! the [`Subscriber`] it opens, and a [`Publisher`]. The dispatch engine drives a
//! subscriber one delivery (or one batch) at a time and settles each delivery through the
//! [`Settle`](crate::Settle) handle the transport put in it. The core knows nothing else
//! about any broker.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;

mod background;
mod connection;
mod describe;
mod shared;

pub use background::Background;
pub use connection::{ConnectionHealth, ConnectionProbe, ConnectionState};
pub use describe::QueueDescription;
pub use shared::SharedPublisher;

use crate::admin::{DeadLetter, QueueDepth, QueueSpec};
use crate::delivery::Delivery;
use crate::error::Error;
use crate::message::Message;

/// What the dispatcher tells a transport about a mount when it subscribes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SubscribeSettings {
    /// How many deliveries the mount can hold at most: running, waiting for a lane, or
    /// being gathered into a batch. A transport sizes its read-ahead from it (RabbitMQ's
    /// default prefetch covers it; the SQS pump receives again once the mount has room).
    pub max_in_flight: usize,
    /// The batch size of a batch mount, `None` for a single-delivery handler.
    pub batch_size: Option<usize>,
}

impl SubscribeSettings {
    /// Settings for a mount that holds at most `max_in_flight` deliveries.
    pub fn new(max_in_flight: usize) -> Self {
        SubscribeSettings {
            max_in_flight,
            batch_size: None,
        }
    }
}

/// A queue a handler can be mounted on. Opening it yields a [`Subscriber`].
pub trait Source: Send + 'static {
    /// The subscriber this source opens.
    type Subscriber: Subscriber;

    /// The queue's name, for logs and errors.
    fn queue_name(&self) -> &str;

    /// The messaging system, as OpenTelemetry's `messaging.system` names it (`rabbitmq`,
    /// `aws_sqs`): each delivery's span carries it. A transport that has no name of its
    /// own there keeps the default, `conveyor`.
    fn messaging_system(&self) -> &'static str {
        "conveyor"
    }

    /// The publisher of the broker this queue belongs to: the messages a handler mounted
    /// here returns go through it (see [`MountOptions::publish_to`]). The default has
    /// none; such a mount needs [`MountOptions::publish_via`].
    ///
    /// [`MountOptions::publish_to`]: crate::MountOptions::publish_to
    /// [`MountOptions::publish_via`]: crate::MountOptions::publish_via
    fn publisher(&self) -> Option<SharedPublisher> {
        None
    }

    /// How the app's AsyncAPI document describes the queue `queue` of this source's
    /// broker (this source's own, or a destination its handler publishes to): where the
    /// partition key travels, and the protocol's bindings. The default describes
    /// nothing.
    fn describe(&self, queue: &str) -> QueueDescription {
        let _ = queue;
        QueueDescription::default()
    }

    /// Opens a subscription: declares or checks the queue, opens the receive side.
    /// A failure here fails the app's startup with [`Error::Subscribe`].
    fn subscribe(
        self,
        settings: SubscribeSettings,
    ) -> impl Future<Output = Result<Self::Subscriber, Error>> + Send;
}

/// The receive side of one subscription: one queue, one receive source, one delivery at a
/// time in the order the transport received them.
pub trait Subscriber: Send + 'static {
    /// Waits for the next delivery. `None` means the subscription has ended for good.
    ///
    /// An error is taken as passing: the dispatcher logs it and receives again after a
    /// growing pause. An [`Error::Subscribe`] says the subscription can never work again
    /// (its queue is gone, access is denied): the mount ends with it and the app stops.
    ///
    /// Must be cancel-safe: the dispatcher drops this future at shutdown, and a delivery
    /// the transport had received but not returned must not be lost by that.
    fn recv(&mut self) -> impl Future<Output = Option<Result<Delivery, Error>>> + Send;

    /// Waits for at least one delivery, then appends to `batch` those already available,
    /// up to `max` in all, without waiting for more.
    ///
    /// The default takes one delivery; transports that receive in bulk override it.
    fn recv_batch(
        &mut self,
        max: usize,
        batch: &mut Vec<Delivery>,
    ) -> impl Future<Output = Option<Result<(), Error>>> + Send {
        let _ = max;
        async move {
            match self.recv().await? {
                Ok(delivery) => {
                    batch.push(delivery);
                    Some(Ok(()))
                }
                Err(e) => Some(Err(e)),
            }
        }
    }

    /// The longest this subscription can keep a delivery unsettled before the broker
    /// takes it back on its own (RabbitMQ's consumer timeout, which then closes the
    /// channel); `None` where a delivery can be held as long as needed (a transport that
    /// renews its hold, or whose broker never takes one back). A mount retrying in place
    /// holds a delivery at most half of it, and at most
    /// [`MAX_IN_PLACE_HOLD`](crate::dispatch::MAX_IN_PLACE_HOLD); a retry that would
    /// hold it longer goes back to the broker.
    fn max_hold(&self) -> Option<Duration> {
        None
    }

    /// How to tell whether this subscription's connection is lost, for a transport that
    /// recovers a lost connection by itself, out of sight of [`recv`](Self::recv):
    /// [`RunningApp::health`](crate::RunningApp::health) shows the mount as reconnecting
    /// while the probe says so. (Receive errors that `recv` returns are seen by the
    /// dispatcher.) Asked once, when the mount starts. The default gives none.
    fn connection(&self) -> Option<std::sync::Arc<dyn ConnectionProbe>> {
        None
    }

    /// For a subscription over several shard queues ([`crate::shards::Shards`]): which
    /// shards it holds, for [`RunningApp::health`](crate::RunningApp::health) and
    /// [`RunningApp::lanes`](crate::RunningApp::lanes). Asked once, when the mount starts.
    /// The default, for a subscription to one queue, gives none.
    fn shards(&self) -> Option<std::sync::Arc<dyn ShardsProbe>> {
        None
    }

    /// The work this subscription needs done beside [`recv`](Self::recv) while it is
    /// open (receiving ahead, making settlement calls), for the dispatcher to run on the
    /// mount's own task, side by side with its handlers (see [`Background`]). Asked once,
    /// before the first receive; the dispatcher then polls it until it finishes, which it
    /// does once [`close`](Self::close) is done (dropped before, it runs on in a task of
    /// its own). A subscription whose background is not taken runs it on a task of its
    /// own, from its first call or when it is dropped. The default has none: the
    /// transport's client does such work on its own tasks, or there is none.
    fn background(&mut self) -> Option<Background> {
        None
    }

    /// Stops receiving, at once: makes no new receive, releases what a receive already
    /// under way brings once it completes, and releases every delivery received but not
    /// yet returned by [`recv`](Self::recv), so that other consumers can take them while
    /// this subscription's in-flight handlers finish. Deliveries already returned stay
    /// valid and are settled as usual.
    ///
    /// Called once, when the app starts draining, before its in-flight handlers have
    /// finished; `recv` is not called after it. It must not wait for those handlers, nor
    /// for a long poll to end. The default does nothing, for transports that hold nothing
    /// back.
    fn stop_receiving(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Returns what was received but not handed over to the broker, waits for a receive
    /// still under way, and flushes outstanding settlements. Called once, after every
    /// delivery of this subscription has been settled or dropped.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// Which shards a subscription over several shard queues holds now (see
/// [`Subscriber::shards`]). Asked on every health check: keep it cheap.
pub trait ShardsProbe: Send + Sync {
    /// The shards whose subscription is open now, in order.
    fn held(&self) -> Vec<usize>;
}

/// Sends messages to a destination (a queue, or an exchange with a routing key).
pub trait Publisher: Send + Sync {
    /// Sends one message; returns once the broker has taken it.
    fn publish(
        &self,
        destination: &str,
        message: Message,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Sends several messages, in as few broker calls as the transport allows. Returns the
    /// first error; the messages before it were sent.
    fn publish_batch(
        &self,
        destination: &str,
        messages: Vec<Message>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            for message in messages {
                self.publish(destination, message).await?;
            }
            Ok(())
        }
    }

    /// Sends `value` as a JSON message.
    fn publish_json<T: Serialize + Sync + ?Sized>(
        &self,
        destination: &str,
        value: &T,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let message = Message::json(value);
        async move { self.publish(destination, message?).await }
    }
}

/// A broker: publishes, opens queues to mount handlers on, declares and inspects queues.
///
/// Every transport's broker implements it the same way, so code written against
/// `B: Broker` runs on any of them: only the line that makes the broker changes.
///
/// ```
/// use conveyor::{App, Broker, Json, MemoryBroker, Message, Publisher, QueueSpec};
///
/// async fn place(Json(order): Json<u64>) {
///     println!("order {order}");
/// }
///
/// /// The service, on whichever broker it is given.
/// async fn serve<B: Broker>(broker: B) -> Result<(), conveyor::Error> {
///     broker.declare_queue(&QueueSpec::new("orders-dead")).await?;
///     broker
///         .declare_queue(&QueueSpec::new("orders").dead_letter_queue("orders-dead", 5))
///         .await?;
///     broker.publish("orders", Message::json(&7u64)?).await?;
///     let depth = broker.queue_depth("orders").await?;
///     assert_eq!(depth.ready, 1);
///     App::new("orders")
///         .mount(broker.queue("orders"), place, |m| m)
///         .run_until(async {})
///         .await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), conveyor::Error> {
/// serve(MemoryBroker::new()).await
/// # }
/// ```
///
/// Given to the app with [`App::broker`](crate::App::broker), a broker is closed once
/// every mount has stopped and settled its deliveries, so that nothing the handlers
/// published or acked is cut off.
pub trait Broker: Publisher + Clone + Send + Sync + 'static {
    /// The queue source this broker opens.
    type Queue: Source;

    /// The queue `name` as a source to mount a handler on. Subscribing checks that the
    /// queue exists and declares it, plainly, only where it is missing: a queue declared
    /// with its own settings keeps them.
    fn queue(&self, name: &str) -> Self::Queue;

    /// Declares a queue. Declaring a queue that exists with the same settings succeeds;
    /// with other settings it is an error on brokers that cannot change them
    /// (RabbitMQ), and changes them where the broker can (SQS, in-process).
    fn declare_queue(&self, spec: &QueueSpec) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes the queue `name` and what it holds. Deleting a queue that does not exist
    /// succeeds.
    fn delete_queue(&self, name: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// How many messages the queue `name` holds, as far as the broker tells.
    fn queue_depth(&self, name: &str) -> impl Future<Output = Result<QueueDepth, Error>> + Send;

    /// Takes up to `max` messages ready in the queue `dead_letter_queue` out of it, in
    /// the order the broker gives them, without waiting for more. Meant for the
    /// dead-letter queue of a [`QueueSpec`], whose messages carry the reason they were
    /// rejected; works on any queue.
    fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, Error>> + Send;

    /// Sends `message` to `destination` as a request and waits up to `timeout` for the
    /// reply: the message a handler mounted there returns (see [`crate::request`]). The
    /// request carries the transport's reply address and a correlation id of its own
    /// (replacing any the message had). Many requests may wait at once; each gets its
    /// own reply, or [`Error::Timeout`]. A request the broker refuses fails at once.
    /// Every transport of Conveyor has it; the default, for a broker of your own that has
    /// no way back to the requester, fails with [`Error::Config`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use conveyor::{App, Broker, Json, MemoryBroker, Message};
    ///
    /// async fn price(Json(item): Json<String>) -> Result<Message, conveyor::Error> {
    ///     Message::json(&(item.len() as u64 * 100))
    /// }
    ///
    /// # async fn demo() -> Result<(), conveyor::Error> {
    /// let broker = MemoryBroker::new();
    /// let app = App::new("prices").mount(broker.queue("prices"), price, |m| m).start().await?;
    /// let reply = broker
    ///     .request("prices", Message::json(&"tea")?, Duration::from_secs(5))
    ///     .await?;
    /// assert_eq!(serde_json::from_slice::<u64>(reply.payload()).unwrap(), 300);
    /// app.shutdown().await
    /// # }
    /// ```
    fn request(
        &self,
        destination: &str,
        message: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Message, Error>> + Send {
        let _ = (message, timeout);
        let refused = Error::config(format!(
            "this broker cannot send requests (to `{destination}`): it has no reply address"
        ));
        async move { Err(refused) }
    }

    /// Closes the broker's connections. Called once, at the end of the app's shutdown.
    fn close(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Where each of the broker's connections is now, for
    /// [`RunningApp::health`](crate::RunningApp::health). Asked on every health check:
    /// keep it cheap and never block. The default, for a broker that keeps no
    /// connection (in process, or over HTTP), has none.
    fn connections(&self) -> Vec<ConnectionHealth> {
        Vec::new()
    }
}
