//! Request/reply: a requester publishes a message that carries where to reply and a
//! correlation id of its own, then waits for the reply with that id, up to a timeout.
//!
//! The responder is an ordinary handler, mounted without
//! [`publish_to`](crate::MountOptions::publish_to): a message it returns for a delivery
//! that carries a reply address ([`REPLY_TO_HEADER`](crate::REPLY_TO_HEADER)) goes there,
//! under the request's correlation id (see [`crate::output`]). Each transport chooses the reply
//! address and how replies come back (RabbitMQ's direct reply-to, an SQS reply queue per
//! requester, a direct hand-over in process); they share [`Replies`], which matches
//! replies to the requests waiting for them.
//!
//! A reply that comes after its request gave up, or that answers no request of this
//! requester, is dropped with a debug log: it never reaches another request.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::Error;
use crate::kit;
use crate::message::Message;

/// The requests of one requester waiting for their replies, by correlation id.
///
/// ```
/// use std::time::Duration;
/// use conveyor::Message;
/// use conveyor::request::Replies;
///
/// # async fn demo() -> Result<(), conveyor::Error> {
/// let replies = Replies::new();
/// let reply = replies
///     .request("prices", Duration::from_secs(1), |correlation_id| {
///         // A transport publishes the request here; this one answers at once.
///         let answered = replies.deliver(&correlation_id, Message::new("42"));
///         assert!(answered);
///         async { Ok(()) }
///     })
///     .await?;
/// assert_eq!(&reply.payload()[..], b"42");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Replies {
    /// Makes this requester's correlation ids unlike any other's.
    prefix: String,
    next: AtomicU64,
    waiting: Mutex<HashMap<String, oneshot::Sender<Message>>>,
}

/// A transport requester's [`Replies`] and the task that reads replies off the broker and
/// hands each to its request: what every transport's requester holds. Dropping it stops
/// the task.
#[derive(Debug)]
pub struct ReplyReader {
    replies: Arc<Replies>,
    reading: tokio::task::JoinHandle<()>,
}

impl ReplyReader {
    /// Spawns `read`, given the replies to deliver to (with [`Replies::deliver`]).
    pub fn spawn<F>(read: impl FnOnce(Arc<Replies>) -> F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let replies = Arc::new(Replies::new());
        let reading = tokio::spawn(read(replies.clone()));
        ReplyReader { replies, reading }
    }

    /// The requests waiting for their replies.
    pub fn replies(&self) -> &Replies {
        &self.replies
    }

    /// Whether the task still reads replies.
    pub fn is_reading(&self) -> bool {
        !self.reading.is_finished()
    }

    /// Stops reading replies.
    pub fn stop(&self) {
        self.reading.abort();
    }
}

impl Drop for ReplyReader {
    fn drop(&mut self) {
        self.reading.abort();
    }
}

impl Default for Replies {
    fn default() -> Self {
        Replies::new()
    }
}

impl Replies {
    /// A requester with nothing waiting, whose correlation ids no other process (by its
    /// id and clock) or requester of this process makes.
    pub fn new() -> Self {
        Replies {
            prefix: kit::unique_id(),
            next: AtomicU64::new(0),
            waiting: Mutex::default(),
        }
    }

    /// How many requests wait for their replies now.
    pub fn waiting(&self) -> usize {
        kit::lock(&self.waiting).len()
    }

    /// Sends a request with `send`, given the request's correlation id (the message it
    /// publishes must carry it, and the reply address), then waits up to `timeout` for
    /// the reply. A request given up (timed out, or its future dropped) no longer waits:
    /// its reply, if it comes, is dropped.
    ///
    /// # Errors
    ///
    /// `send`'s error, or [`Error::Timeout`] when no reply came within `timeout`.
    pub async fn request<F, Fut>(
        &self,
        destination: &str,
        timeout: Duration,
        send: F,
    ) -> Result<Message, Error>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        within(
            destination,
            timeout,
            self.exchange(destination, timeout, send),
        )
        .await
    }

    /// [`request`](Self::request) without a time limit of its own, for a transport that
    /// runs it inside one [`within`] together with what it does first (opening its
    /// requester): one timer for the whole request. `timeout` is the caller's, which an
    /// error names.
    ///
    /// # Errors
    ///
    /// `send`'s error; [`Error::Timeout`] naming `timeout` if the requester is dropped
    /// first.
    pub async fn exchange<F, Fut>(
        &self,
        destination: &str,
        timeout: Duration,
        send: F,
    ) -> Result<Message, Error>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let correlation_id = format!("{}-{number:x}", self.prefix);
        let (answer, answered) = oneshot::channel();
        kit::lock(&self.waiting).insert(correlation_id.clone(), answer);
        let _waiting = Waiting {
            replies: self,
            correlation_id: &correlation_id,
        };
        send(correlation_id.clone()).await?;
        // The sender is only dropped with the entry, which this request removes.
        answered.await.map_err(|_| timed_out(destination, timeout))
    }

    /// Hands `reply` to the request with `correlation_id`. Returns false, with a debug
    /// log, when no request of this requester waits for it (it gave up, or the id is
    /// another's).
    pub fn deliver(&self, correlation_id: &str, reply: Message) -> bool {
        let answer = kit::lock(&self.waiting).remove(correlation_id);
        let delivered = answer.is_some_and(|answer| answer.send(reply).is_ok());
        if !delivered {
            tracing::debug!(
                correlation_id,
                "dropping a reply that no request waits for (it came too late, or is another's)"
            );
        }
        delivered
    }
}

/// Removes a request from the waiting ones when it ends, however it ends.
struct Waiting<'a> {
    replies: &'a Replies,
    correlation_id: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        kit::lock(&self.replies.waiting).remove(self.correlation_id);
    }
}

/// A transport's requester: the address its replies come back to, and the task that
/// reads them off the broker. [`Requests`] opens one at a broker's first request.
#[derive(Debug)]
pub struct Requester {
    reply_to: String,
    reader: ReplyReader,
}

impl Requester {
    /// A requester whose replies come back to `reply_to`, read by `reader`.
    pub fn new(reply_to: impl Into<String>, reader: ReplyReader) -> Self {
        Requester {
            reply_to: reply_to.into(),
            reader,
        }
    }
}

/// A broker's requests: its [`Requester`], opened by the first request (and again once
/// its reader has stopped), and each request published through the broker with the
/// requester's reply address and a correlation id of its own.
///
/// ```
/// use std::time::Duration;
/// use conveyor::request::{Requester, Requests, ReplyReader};
/// use conveyor::{MemoryBroker, Message};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let broker = MemoryBroker::new();
/// let requests = Requests::default();
/// // A requester whose replies nobody sends: the request times out.
/// let open = || async { Ok(Requester::new("replies", ReplyReader::spawn(|_| std::future::pending()))) };
/// let asked = requests
///     .request(&broker, "prices", Message::new("?"), Duration::from_millis(10), open)
///     .await;
/// assert!(matches!(asked, Err(conveyor::Error::Timeout { .. })));
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Requests {
    requester: tokio::sync::Mutex<Option<Arc<Requester>>>,
}

impl Requests {
    /// Sends `message` to `destination` through `publisher` as a request, and waits up to
    /// `timeout` (opening the requester with `open` included) for its reply.
    ///
    /// # Errors
    ///
    /// What opening the requester or publishing fails with; [`Error::Timeout`] once
    /// `timeout` has passed.
    pub async fn request<P, F, Fut>(
        &self,
        publisher: &P,
        destination: &str,
        mut message: Message,
        timeout: Duration,
        open: F,
    ) -> Result<Message, Error>
    where
        P: crate::Publisher + ?Sized,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Requester, Error>>,
    {
        within(destination, timeout, async {
            let requester = self.requester(open).await?;
            requester
                .reader
                .replies()
                .exchange(destination, timeout, |correlation_id| {
                    message.set_correlation_id(correlation_id);
                    message.set_reply_to(requester.reply_to.clone());
                    publisher.publish(destination, message)
                })
                .await
        })
        .await
    }

    /// The requester, opened with `open` if there is none reading.
    async fn requester<F, Fut>(&self, open: F) -> Result<Arc<Requester>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Requester, Error>>,
    {
        let mut current = self.requester.lock().await;
        if let Some(reading) = current.as_ref().filter(|r| r.reader.is_reading()) {
            return Ok(reading.clone());
        }
        let opened = Arc::new(open().await?);
        *current = Some(opened.clone());
        Ok(opened)
    }
}

/// Runs `request`, a whole request to `destination`, for at most `timeout`: a transport
/// wraps in it what it does before [`Replies::exchange`] too (opening its requester, say),
/// so a slow broker never holds the caller past its timeout.
///
/// ```
/// use std::time::Duration;
/// use conveyor::request::within;
///
/// # async fn demo() {
/// let stalled = within("prices", Duration::from_millis(10), std::future::pending::<Result<(), _>>());
/// assert!(matches!(stalled.await, Err(conveyor::Error::Timeout { .. })));
/// # }
/// ```
///
/// # Errors
///
/// `request`'s error, or [`Error::Timeout`] once `timeout` has passed.
pub async fn within<T>(
    destination: &str,
    timeout: Duration,
    request: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(timeout, request)
        .await
        .unwrap_or_else(|_| Err(timed_out(destination, timeout)))
}

/// The error of a request to `destination` that got no reply within `timeout`.
fn timed_out(destination: &str, timeout: Duration) -> Error {
    Error::Timeout {
        what: format!("a reply to the request sent to `{destination}`"),
        after: timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request whose requester still reads reuses it; one whose requester stopped
    /// reading opens another.
    #[tokio::test]
    async fn a_requester_is_opened_once_and_again_once_it_stops_reading() {
        use std::sync::atomic::AtomicUsize;

        let broker = crate::MemoryBroker::new();
        let requests = Requests::default();
        let opened = AtomicUsize::new(0);
        let open = || {
            opened.fetch_add(1, Ordering::Relaxed);
            async {
                let reader = ReplyReader::spawn(|_| std::future::pending());
                Ok(Requester::new("replies", reader))
            }
        };
        let ask = || {
            requests.request(
                &broker,
                "prices",
                Message::new("?"),
                Duration::from_millis(20),
                open,
            )
        };
        // No responder: each request times out, once its requester is open.
        assert!(ask().await.is_err());
        assert!(ask().await.is_err());
        assert_eq!(opened.load(Ordering::Relaxed), 1, "reused while it reads");
        let current = requests.requester.lock().await.clone().unwrap();
        current.reader.stop();
        let stopped = async {
            while current.reader.is_reading() {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), stopped)
            .await
            .expect("the reader stops");
        assert!(ask().await.is_err());
        assert_eq!(
            opened.load(Ordering::Relaxed),
            2,
            "opened again once it stopped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_after_its_request_timed_out_is_dropped_and_reaches_no_other() {
        let replies = Replies::new();
        let mut first = String::new();
        let timed_out = replies
            .request("q", Duration::from_secs(1), |id| {
                first = id;
                async { Ok(()) }
            })
            .await;
        assert!(matches!(timed_out, Err(Error::Timeout { .. })));
        assert_eq!(replies.waiting(), 0);

        let second = replies.request("q", Duration::from_secs(1), |id| {
            // The first request's late reply comes while the second waits.
            assert!(!replies.deliver(&first, Message::new("late")));
            assert!(replies.deliver(&id, Message::new("mine")));
            async { Ok(()) }
        });
        assert_eq!(&second.await.unwrap().payload()[..], b"mine");
    }

    #[tokio::test]
    async fn a_request_that_cannot_be_sent_fails_at_once_and_waits_for_nothing() {
        let replies = Replies::new();
        let refused = replies
            .request("q", Duration::from_secs(3600), |_| async {
                Err(Error::config("no such queue"))
            })
            .await;
        assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
        assert_eq!(replies.waiting(), 0);
    }

    #[test]
    fn two_requesters_make_different_correlation_ids() {
        assert_ne!(Replies::new().prefix, Replies::new().prefix);
    }
}
