//! Redis Streams transport for [Conveyor](conveyor), over `redis` (redis-rs).
//!
//! A queue is a stream of its name, read through the consumer group `conveyor`; each
//! subscription is a consumer of its own in it. The subscription runs on the core's kit
//! ([`conveyor::kit::PullSubscriber`]):
//!
//! - **Receiving**: delayed messages that are due move into the stream; entries whose
//!   lease lapsed (a consumer died) or that were released are claimed first (`XPENDING`
//!   then `XCLAIM`), else new ones are read (`XREADGROUP`, blocking up to the fetch
//!   wait).
//! - **Leases**: an entry is leased for the queue's visibility timeout; while its
//!   handler runs it is renewed (its idle time reset, if this consumer still holds it).
//! - **Settling**: ack is `XACK` and `XDEL`; retry and release make the entry claimable
//!   at once; retry-after moves it into the delayed set (a sorted set by due time),
//!   keeping its attempt count; a reject goes to the dead-letter queue with its reason,
//!   or is dropped where the queue has none.
//! - **Dead letters**: the queue's dead-letter queue and max receive count live in its
//!   policy hash (`<queue>:conveyor:policy`); an entry delivered more often goes there
//!   unhandled.
//! - **Partition keys** travel in the entry's `key` field; headers as `h:<name>` fields,
//!   binary-safe.
//! - **Publishing** is `XADD` (a batch in one atomic round trip); a delayed message waits
//!   in the delayed set.
//!
//! Why redis-rs and not fred: the transport needs plain commands, three Lua scripts and
//! a connection that reconnects, which redis-rs gives with few dependencies
//! (`connection-manager`); fred's pooling, cluster and client-tracking machinery would
//! add build time for nothing this transport uses.
//!
//! ```no_run
//! use conveyor::{App, Json, Publisher};
//! use conveyor_redis::RedisBroker;
//!
//! async fn greet(Json(name): Json<String>) {
//!     println!("hello, {name}");
//! }
//!
//! # async fn run() -> Result<(), conveyor::Error> {
//! let broker = RedisBroker::connect("redis://127.0.0.1:6379").await?;
//! broker.publish_json("greetings", "Ada").await?;
//! let app = App::new("greeter")
//!     .mount(broker.queue("greetings"), greet, |m| m)
//!     .start()
//!     .await?;
//! app.shutdown().await?;
//! # Ok(()) }
//! ```

mod admin;
mod broker;
mod error;
mod fields;
mod queue;
mod request;
mod scripts;

pub use broker::{GROUP, RedisBroker, RedisBrokerBuilder};
pub use error::RedisError;
pub use fields::PARTITION_KEY_HEADER;
pub use queue::RedisQueue;

/// A Redis subscription: the kit's pulling subscriber.
pub type RedisSubscriber = conveyor::kit::PullSubscriber;
