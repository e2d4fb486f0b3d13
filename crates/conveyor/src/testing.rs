//! A test harness: run an app on the in-process transport, publish, wait until it is idle,
//! then assert on what was handled, published and dead-lettered.
//!
//! ```
//! use conveyor::testing::TestApp;
//! use conveyor::{App, Json, MemoryBroker};
//!
//! async fn double(Json(n): Json<u64>) -> Result<(), String> {
//!     if n == 0 { Err("zero".into()) } else { Ok(()) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), conveyor::Error> {
//! let broker = MemoryBroker::new();
//! let app = App::new("doubler").mount(broker.queue("numbers"), double, |m| m.reject_on_error());
//! let test = TestApp::start(app, &broker).await?;
//! test.publish_json("numbers", &2u64).await?;
//! test.publish_json("numbers", &0u64).await?;
//! test.settled().await?;
//! assert_eq!(test.acked("numbers").len(), 1);
//! assert_eq!(test.rejected("numbers")[0].reason, "zero");
//! test.stop().await
//! # }
//! ```

use std::time::Duration;

use serde::Serialize;

use crate::app::{App, RunningApp};
use crate::error::Error;
use crate::lanes_view::MountLanes;
use crate::layer::Layer;
use crate::memory::{MemoryBroker, RecordedMessage, Rejected};
use crate::message::Message;
use crate::transport::Publisher;

/// How long the harness waits for a condition by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// An app running on an in-process broker, for tests.
#[derive(Debug)]
pub struct TestApp {
    broker: MemoryBroker,
    running: RunningApp,
    deadline: Duration,
}

impl TestApp {
    /// Turns on the broker's history and starts `app`: every subscription is open when
    /// this returns.
    ///
    /// # Errors
    ///
    /// What [`App::start`] fails with.
    pub async fn start<L: Layer + Clone>(
        app: App<L>,
        broker: &MemoryBroker,
    ) -> Result<Self, Error> {
        broker.record_history(true);
        let running = app.start().await?;
        Ok(TestApp {
            broker: broker.clone(),
            running,
            deadline: DEFAULT_DEADLINE,
        })
    }

    /// How long [`settled`](Self::settled) and [`drained`](Self::drained) wait before
    /// failing (default 30 s, on tokio's clock).
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The broker the app runs on.
    pub fn broker(&self) -> &MemoryBroker {
        &self.broker
    }

    /// Publishes `message` to `queue`.
    ///
    /// # Errors
    ///
    /// The broker's publish error.
    pub async fn publish(&self, queue: &str, message: Message) -> Result<(), Error> {
        self.broker.publish(queue, message).await
    }

    /// Publishes `value` as JSON to `queue`.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] when `value` is no JSON, or the broker's publish error.
    pub async fn publish_json<T: Serialize + Sync + ?Sized>(
        &self,
        queue: &str,
        value: &T,
    ) -> Result<(), Error> {
        self.broker.publish_json(queue, value).await
    }

    /// Waits until everything published and due has been handled and settled. Messages
    /// waiting out a delay are left alone: advance the clock, or use
    /// [`drained`](Self::drained).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the test's deadline passes first.
    pub async fn settled(&self) -> Result<(), Error> {
        self.wait("the app to settle everything due", self.broker.wait_idle())
            .await
    }

    /// Waits until everything, delayed messages included, has been handled and settled.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the test's deadline passes first.
    pub async fn drained(&self) -> Result<(), Error> {
        self.wait("the app to drain every queue", self.broker.wait_drained())
            .await
    }

    async fn wait(
        &self,
        what: &str,
        condition: impl std::future::Future<Output = ()>,
    ) -> Result<(), Error> {
        tokio::time::timeout(self.deadline, condition)
            .await
            .map_err(|_| Error::Timeout {
                what: what.to_string(),
                after: self.deadline,
            })
    }

    /// The live view of the app's lanes mounts: see
    /// [`RunningApp::lanes`](crate::RunningApp::lanes).
    pub fn lanes(&self) -> Vec<MountLanes> {
        self.running.lanes()
    }

    /// Messages acked from `queue`.
    pub fn acked(&self, queue: &str) -> Vec<RecordedMessage> {
        self.broker.acked(queue)
    }

    /// Messages published to `queue`, by the test or by handlers.
    pub fn published(&self, queue: &str) -> Vec<RecordedMessage> {
        self.broker.published(queue)
    }

    /// Messages rejected from `queue`, with their reasons.
    pub fn rejected(&self, queue: &str) -> Vec<Rejected> {
        self.broker.rejected(queue)
    }

    /// Shuts the app down gracefully and returns its result.
    ///
    /// # Errors
    ///
    /// What [`RunningApp::shutdown`](crate::RunningApp::shutdown) fails with.
    pub async fn stop(self) -> Result<(), Error> {
        self.running.shutdown().await
    }
}
