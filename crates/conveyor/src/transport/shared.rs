//! One publisher type for every transport.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::error::Error;
use crate::message::Message;
use crate::transport::Publisher;

/// A [`Publisher`] of any transport behind one type, as a mount keeps the one its outputs
/// go through. It publishes as the publisher it wraps does.
///
/// ```
/// use conveyor::{MemoryBroker, Publisher, SharedPublisher};
///
/// # async fn demo() -> Result<(), conveyor::Error> {
/// let publisher = SharedPublisher::new(MemoryBroker::new());
/// publisher.publish_json("orders", &7u64).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SharedPublisher(Arc<dyn ErasedPublisher>);

impl SharedPublisher {
    /// Wraps `publisher`.
    pub fn new(publisher: impl Publisher + 'static) -> Self {
        SharedPublisher(Arc::new(publisher))
    }
}

impl fmt::Debug for SharedPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedPublisher")
    }
}

/// [`Publisher`] with boxed futures, so that it can be a trait object.
trait ErasedPublisher: Send + Sync {
    fn publish_boxed<'a>(
        &'a self,
        destination: &'a str,
        message: Message,
    ) -> BoxFuture<'a, Result<(), Error>>;

    fn publish_batch_boxed<'a>(
        &'a self,
        destination: &'a str,
        messages: Vec<Message>,
    ) -> BoxFuture<'a, Result<(), Error>>;
}

impl<P: Publisher> ErasedPublisher for P {
    fn publish_boxed<'a>(
        &'a self,
        destination: &'a str,
        message: Message,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.publish(destination, message))
    }

    fn publish_batch_boxed<'a>(
        &'a self,
        destination: &'a str,
        messages: Vec<Message>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.publish_batch(destination, messages))
    }
}

impl Publisher for SharedPublisher {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        self.0.publish_boxed(destination, message).await
    }

    async fn publish_batch(&self, destination: &str, messages: Vec<Message>) -> Result<(), Error> {
        self.0.publish_batch_boxed(destination, messages).await
    }
}
