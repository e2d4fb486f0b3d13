//! A transactional outbox: publish exactly when your database commits.
//!
//! [`Outbox`] is a [`Publisher`] that does not publish: it adds each message to an
//! [`OutboxStore`], a table in your database written through the transaction your
//! handler or request is in. The messages exist once that transaction commits, and not
//! if it rolls back. An [`OutboxRelay`], running beside your app with a store of its
//! own, takes what was committed, publishes it through a real publisher in the order it
//! was added, and marks it sent.
//!
//! At least once: a crash after a publish and before its mark publishes that message
//! again; a crash between the commit and the relay loses nothing, since the relay finds
//! the rows when it starts. A message whose publish fails stops the pass there, so that
//! nothing after it (of its partition key, or any other) overtakes it; but one the
//! broker refuses for good ([`Error::Refused`]) is set aside where the store can
//! ([`OutboxStore::set_aside`]), and the pass goes on.
//!
//! The order is the store's ids. A store whose ids are given as rows are added (an
//! auto-increment) can see two transactions commit out of id order: the relay may then
//! publish the later id first, if it runs between the two commits. To keep a key's order
//! across concurrent writers, write one key's messages from one transaction at a time (a
//! row lock on what the key stands for does it), or give ids at commit.
//!
//! The store is a small trait, so that the core takes no database crate; `examples/
//! outbox.rs` has one over SQLite. [`encode`] and [`decode`] turn a message into bytes
//! and back, for a store that keeps it in one column.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use conveyor::outbox::{Outbox, OutboxEntry, OutboxRelay, OutboxStore};
//! use conveyor::{Error, MemoryBroker, Message, Publisher};
//!
//! /// A store in memory: what a table would hold.
//! #[derive(Clone, Default)]
//! struct Table(Arc<Mutex<Vec<(OutboxEntry, bool)>>>);
//!
//! impl OutboxStore for Table {
//!     async fn add(&self, destination: &str, message: Message) -> Result<(), Error> {
//!         let mut rows = self.0.lock().unwrap();
//!         let id = rows.len() as u64;
//!         rows.push((OutboxEntry { id, destination: destination.into(), message }, false));
//!         Ok(())
//!     }
//!     async fn pending(&self, max: usize) -> Result<Vec<OutboxEntry>, Error> {
//!         let rows = self.0.lock().unwrap();
//!         Ok(rows.iter().filter(|(_, sent)| !sent).take(max).map(|(e, _)| e.clone()).collect())
//!     }
//!     async fn mark_sent(&self, ids: &[u64]) -> Result<(), Error> {
//!         for (entry, sent) in self.0.lock().unwrap().iter_mut() {
//!             *sent |= ids.contains(&entry.id);
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Error> {
//! let table = Table::default();
//! // In the transaction that saves the order:
//! Outbox::new(table.clone()).publish_json("orders", &7u64).await?;
//! // Beside the app:
//! let broker = MemoryBroker::new();
//! let relayed = OutboxRelay::new(table, broker.clone()).relay_once().await?;
//! assert_eq!(relayed, 1);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::error::Error;
use crate::headers::Headers;
use crate::kit::RetryPause;
use crate::message::Message;
use crate::transport::Publisher;

/// A message in an outbox: the id the store gave it (increasing in the order added),
/// where it goes, and the message.
#[derive(Clone, Debug)]
pub struct OutboxEntry {
    /// The store's id for it; the relay publishes in the order of these.
    pub id: u64,
    /// The destination it was published to.
    pub destination: String,
    /// The message.
    pub message: Message,
}

/// Where an outbox keeps messages until the relay has published them: a table in your
/// database. The writing side ([`add`](Self::add)) runs in your transaction; the relay's
/// ([`pending`](Self::pending), [`mark_sent`](Self::mark_sent)) on a store of its own.
pub trait OutboxStore: Send + Sync {
    /// Adds `message` for `destination`, in the transaction this store writes through.
    fn add(
        &self,
        destination: &str,
        message: Message,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Up to `max` committed messages not marked sent, in the order they were added.
    fn pending(&self, max: usize) -> impl Future<Output = Result<Vec<OutboxEntry>, Error>> + Send;

    /// Marks the messages with these ids sent.
    fn mark_sent(&self, ids: &[u64]) -> impl Future<Output = Result<(), Error>> + Send;

    /// Sets aside the message `id`, which the broker refused for good, for `reason`
    /// ([`Error::Refused`]: too large, too many headers, a delay it cannot do): sent again
    /// it would fail the same way, and hold back every message after it for ever. A store
    /// that can (a `failed` column, say, which [`pending`](Self::pending) then leaves
    /// out) returns `Ok(true)`, and the relay goes on past the message, logging it; the
    /// messages after it, of its partition key too, are then published without it. By
    /// default a store cannot: the relay stops at the message, as at any failure, until
    /// someone fixes it or takes it out.
    fn set_aside(&self, id: u64, reason: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (id, reason);
        async { Ok(false) }
    }
}

/// A [`Publisher`] that adds each message to an [`OutboxStore`] instead of publishing it:
/// give it the store of the transaction the rest of your writes are in.
#[derive(Clone, Debug)]
pub struct Outbox<S> {
    store: S,
}

impl<S: OutboxStore> Outbox<S> {
    /// An outbox writing to `store`.
    pub fn new(store: S) -> Self {
        Outbox { store }
    }

    /// The store, back.
    pub fn into_inner(self) -> S {
        self.store
    }
}

impl<S: OutboxStore> Publisher for Outbox<S> {
    /// Adds the message to the store: it is published once the transaction commits and
    /// the relay runs.
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        self.store.add(destination, message).await
    }
}

/// Publishes what an [`OutboxStore`] holds, in order, and marks it sent.
#[derive(Debug)]
pub struct OutboxRelay<S, P> {
    store: S,
    publisher: P,
    batch: usize,
    interval: Duration,
}

impl<S: OutboxStore, P: Publisher> OutboxRelay<S, P> {
    /// A relay from `store` to `publisher`: 100 messages a pass, a pass every 100 ms
    /// while there is nothing to do.
    pub fn new(store: S, publisher: P) -> Self {
        OutboxRelay {
            store,
            publisher,
            batch: 100,
            interval: Duration::from_millis(100),
        }
    }

    /// How many messages one pass takes (at least 1).
    pub fn batch(mut self, messages: usize) -> Self {
        self.batch = messages.max(1);
        self
    }

    /// How long [`run_until`](Self::run_until) waits after a pass that found nothing,
    /// or failed.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// One pass: publishes pending messages in order, each taken by the broker before
    /// the next, marking them sent as it goes; returns how many it published. A publish
    /// that fails ends the pass with its error, after marking those before it: the
    /// next pass starts with it. A message refused for good is set aside instead, if
    /// the store can ([`OutboxStore::set_aside`]).
    ///
    /// # Errors
    ///
    /// The store's error, or the first publish's error that is not a refusal set aside.
    pub async fn relay_once(&self) -> Result<usize, Error> {
        self.pass(&mut || false)
            .await
            .map_err(|stopped| stopped.error)
    }

    /// [`relay_once`](Self::relay_once), saying more of a pass that failed. It ends early,
    /// marking what it sent, once `stop_asked` says so (asked before each publish): a
    /// relay told to stop does not first publish the rest of a batch to a slow broker.
    async fn pass(&self, stop_asked: &mut impl FnMut() -> bool) -> Result<usize, Stopped> {
        let store_failed = |error| Stopped {
            id: None,
            error,
            progressed: false,
        };
        let pending = self.store.pending(self.batch).await.map_err(store_failed)?;
        let mut sent = Vec::with_capacity(pending.len());
        let mut set_aside = false;
        let mut failed = None;
        for entry in pending {
            if stop_asked() {
                break;
            }
            match self
                .publisher
                .publish(&entry.destination, entry.message)
                .await
            {
                Ok(()) => sent.push(entry.id),
                Err(error @ Error::Refused { .. }) => {
                    let reason = crate::Report(&error).to_string();
                    let set = match self.store.set_aside(entry.id, &reason).await {
                        Ok(set) => set,
                        // Stop here, as at any failure: those sent before are marked.
                        Err(store_error) => {
                            failed = Some((entry.id, store_error));
                            break;
                        }
                    };
                    if set {
                        set_aside = true;
                        tracing::warn!(
                            outbox_id = entry.id,
                            destination = %entry.destination,
                            reason,
                            "set aside an outbox message the broker refuses for good"
                        );
                        continue;
                    }
                    failed = Some((entry.id, error));
                    break;
                }
                Err(error) => {
                    failed = Some((entry.id, error));
                    break;
                }
            }
        }
        if !sent.is_empty() {
            self.store.mark_sent(&sent).await.map_err(store_failed)?;
        }
        match failed {
            Some((id, error)) => Err(Stopped {
                id: Some(id),
                error,
                progressed: set_aside || !sent.is_empty(),
            }),
            None => Ok(sent.len()),
        }
    }

    /// Relays until `signal` completes: passes one after another while they find
    /// messages, and every [`interval`](Self::interval) otherwise. A failed pass is
    /// logged, with the id of the message whose publish failed, and tried again after a
    /// pause: 100 ms (or the interval, if longer), doubling with each pass in a row that
    /// failed without publishing or setting aside anything, up to 30 s, so that a broker
    /// that is away, or a message it will never take, is not asked again ten times a
    /// second. Such a message holds back all that follows it until it is published, set
    /// aside ([`OutboxStore::set_aside`]), fixed or taken out of the store.
    ///
    /// Once `signal` completes, a pass under way ends after the publish it is making:
    /// those sent are marked, the rest wait for the next run.
    pub async fn run_until(&self, signal: impl Future<Output = ()>) {
        let mut signal = std::pin::pin!(signal);
        let mut failures = RetryPause::new();
        loop {
            let mut signalled = false;
            let mut stop_asked = || {
                signalled =
                    signalled || futures_util::FutureExt::now_or_never(signal.as_mut()).is_some();
                signalled
            };
            let passed = self.pass(&mut stop_asked).await;
            let wait = match passed {
                Ok(0) => {
                    failures.reset();
                    Some(self.interval)
                }
                Ok(_) => {
                    failures.reset();
                    None
                }
                Err(Stopped {
                    id,
                    error,
                    progressed,
                }) => {
                    // A pass that got some way is no failure in a row: a broker that
                    // refuses one publish in fifty must not slow the relay to a crawl.
                    if progressed {
                        failures.reset();
                    }
                    let pause = failures.failed().max(self.interval);
                    tracing::warn!(
                        outbox_id = id,
                        error = %crate::Report(&error),
                        ?pause,
                        "relaying the outbox failed; trying again after a pause"
                    );
                    Some(pause)
                }
            };
            if signalled {
                return;
            }
            match wait {
                Some(pause) => tokio::select! {
                    () = &mut signal => return,
                    () = tokio::time::sleep(pause) => {}
                },
                None if futures_util::FutureExt::now_or_never(&mut signal).is_some() => return,
                None => {}
            }
        }
    }
}

/// A pass of the relay that failed.
struct Stopped {
    /// The message whose publish failed; `None` when the store failed.
    id: Option<u64>,
    error: Error,
    /// Whether the pass published or set aside messages before it failed.
    progressed: bool,
}

/// The version of [`encode`]'s format. Version 2 writes the delay as a presence byte,
/// then whole seconds and nanoseconds: version 1's whole milliseconds cut 1.5 ms to 1 ms,
/// and its "no delay" marker (`u64::MAX` ms) was also a delay a message could have.
/// [`encode`] writes version 1 still where it holds the delay exactly, and [`decode`]
/// reads both.
const FORMAT: u8 = 2;

/// Version 1 of the format: the delay in whole milliseconds, `u64::MAX` for none.
const FORMAT_MILLIS: u8 = 1;

/// `message` as bytes, for a store that keeps it in one column: its payload, headers,
/// partition key, properties and delay. [`decode`] gives it back.
pub fn encode(message: &Message) -> Vec<u8> {
    // Version 1 wherever it holds the delay exactly (none, or whole milliseconds), so
    // that in a rolling deploy a relay not yet upgraded reads what an upgraded writer adds.
    let millis = match message.delay() {
        None => Some(u64::MAX),
        Some(delay) if delay.subsec_nanos() % 1_000_000 == 0 => u64::try_from(delay.as_millis())
            .ok()
            .filter(|ms| *ms != u64::MAX),
        Some(_) => None,
    };
    let mut out = Vec::with_capacity(message.payload().len().saturating_add(64));
    out.push(if millis.is_some() {
        FORMAT_MILLIS
    } else {
        FORMAT
    });
    let text = |out: &mut Vec<u8>, value: Option<&str>| match value {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            put(out, value.as_bytes());
        }
    };
    text(&mut out, message.partition_key().map(|key| key.as_str()));
    text(&mut out, message.content_type());
    text(&mut out, message.message_id());
    text(&mut out, message.correlation_id());
    text(&mut out, message.reply_to());
    match millis {
        Some(millis) => out.extend_from_slice(&millis.to_be_bytes()),
        // Version 2 is written only for a delay version 1 cannot hold.
        None => {
            let delay = message.delay().unwrap_or_default();
            out.push(1);
            out.extend_from_slice(&delay.as_secs().to_be_bytes());
            out.extend_from_slice(&delay.subsec_nanos().to_be_bytes());
        }
    }
    out.extend_from_slice(&(message.headers().len() as u64).to_be_bytes());
    for (name, value) in message.headers().iter() {
        put(&mut out, name.as_bytes());
        put(&mut out, value);
    }
    put(&mut out, message.payload());
    out
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The message [`encode`] made `bytes` of (in this format or the one before it);
/// [`Error::Config`] if they are not such.
///
/// # Errors
///
/// [`Error::Config`] when `bytes` are not a record [`encode`] made.
pub fn decode(bytes: &[u8]) -> Result<Message, Error> {
    let bad = || Error::config("an outbox record that is not one encode made");
    let mut reader = Reader(bytes);
    let format = match reader.take(1).ok_or_else(bad)? {
        [version @ (FORMAT | FORMAT_MILLIS)] => *version,
        _ => return Err(bad()),
    };
    let mut builder = Message::builder();
    if let Some(key) = reader.text().ok_or_else(bad)? {
        builder = builder.partition_key(key);
    }
    if let Some(content_type) = reader.text().ok_or_else(bad)? {
        builder = builder.content_type(content_type);
    }
    if let Some(id) = reader.text().ok_or_else(bad)? {
        builder = builder.message_id(id);
    }
    if let Some(id) = reader.text().ok_or_else(bad)? {
        builder = builder.correlation_id(id);
    }
    if let Some(to) = reader.text().ok_or_else(bad)? {
        builder = builder.reply_to(to);
    }
    let delay = if format == FORMAT_MILLIS {
        let millis = reader.number().ok_or_else(bad)?;
        (millis != u64::MAX).then(|| Duration::from_millis(millis))
    } else {
        reader.delay().ok_or_else(bad)?
    };
    if let Some(delay) = delay {
        builder = builder.delay(delay);
    }
    let mut headers = Headers::new();
    for _ in 0..reader.number().ok_or_else(bad)? {
        let name =
            String::from_utf8(reader.bytes().ok_or_else(bad)?.to_vec()).map_err(|_| bad())?;
        let value = Bytes::copy_from_slice(reader.bytes().ok_or_else(bad)?);
        headers.insert(name, value);
    }
    let payload = Bytes::copy_from_slice(reader.bytes().ok_or_else(bad)?);
    if !reader.0.is_empty() {
        return Err(bad());
    }
    let mut message = builder.payload(payload);
    *message.headers_mut() = headers;
    Ok(message)
}

/// Reads what [`encode`] wrote; `None` where the bytes run out or make no sense.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn number(&mut self) -> Option<u64> {
        let bytes: [u8; 8] = self.take(8)?.try_into().ok()?;
        Some(u64::from_be_bytes(bytes))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.number()?).ok()?;
        self.take(len)
    }

    /// `Some(None)` for no delay, `None` for bytes that are not one (nanoseconds of a
    /// whole second or more included: `Duration::new` would carry them into the seconds,
    /// and overflow).
    fn delay(&mut self) -> Option<Option<Duration>> {
        match self.take(1)? {
            [0] => Some(None),
            [1] => {
                let seconds = self.number()?;
                let nanos = u32::from_be_bytes(self.take(4)?.try_into().ok()?);
                (nanos < 1_000_000_000).then(|| Some(Duration::new(seconds, nanos)))
            }
            _ => None,
        }
    }

    /// `Some(None)` for an absent text, `None` for bytes that are not one.
    fn text(&mut self) -> Option<Option<String>> {
        match self.take(1)? {
            [0] => Some(None),
            [1] => String::from_utf8(self.bytes()?.to_vec()).ok().map(Some),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_comes_back_from_its_bytes_whole() {
        let message = Message::builder()
            .partition_key("alice")
            .header("x-binary", Bytes::from_static(&[0, 255]))
            .header("x-text", "a")
            .content_type("text/plain")
            .message_id("m-1")
            .correlation_id("c-1")
            .reply_to("replies")
            .delay(Duration::from_millis(1500))
            .payload(Bytes::from_static(&[1, 2, 3]));
        let back = decode(&encode(&message)).unwrap();
        assert_eq!(back.payload(), message.payload());
        assert_eq!(back.partition_key(), message.partition_key());
        assert_eq!(back.content_type(), Some("text/plain"));
        assert_eq!(back.message_id(), Some("m-1"));
        assert_eq!(back.correlation_id(), Some("c-1"));
        assert_eq!(back.reply_to(), Some("replies"));
        assert_eq!(back.delay(), Some(Duration::from_millis(1500)));
        assert_eq!(
            back.headers().get("x-binary").map(|v| &v[..]),
            Some(&[0, 255][..])
        );
        assert_eq!(back.headers().get_str("x-text"), Some("a"));

        let bare = decode(&encode(&Message::new("x"))).unwrap();
        assert_eq!(bare.delay(), None);
        assert!(bare.headers().is_empty() && bare.partition_key().is_none());
    }

    #[test]
    fn the_delay_comes_back_to_the_nanosecond_at_any_length() {
        let delays = [
            None,
            Some(Duration::ZERO),
            Some(Duration::from_micros(1500)),
            Some(Duration::from_millis(u64::MAX)),
            Some(Duration::MAX),
        ];
        for delay in delays {
            let builder = Message::builder();
            let builder = match delay {
                Some(delay) => builder.delay(delay),
                None => builder,
            };
            let back = decode(&encode(&builder.payload("x"))).unwrap();
            assert_eq!(back.delay(), delay);
        }
    }

    #[test]
    fn a_record_of_the_first_format_still_decodes() {
        // Version 1 as it was written: no texts, the delay in milliseconds (`u64::MAX`
        // for none), no headers, the payload.
        let record = |delay: u64| {
            let mut bytes = vec![1, 0, 0, 0, 0, 0];
            bytes.extend_from_slice(&delay.to_be_bytes());
            bytes.extend_from_slice(&0u64.to_be_bytes());
            bytes.extend_from_slice(&2u64.to_be_bytes());
            bytes.extend_from_slice(b"hi");
            bytes
        };
        let delayed = decode(&record(1500)).unwrap();
        assert_eq!(delayed.delay(), Some(Duration::from_millis(1500)));
        assert_eq!(&delayed.payload()[..], b"hi");
        assert_eq!(decode(&record(u64::MAX)).unwrap().delay(), None);
    }

    /// What the first format can hold exactly is written in it, for a relay not yet
    /// upgraded; the rest in the second. Either way it comes back as it went.
    #[test]
    fn a_record_the_first_format_can_hold_is_written_in_it() {
        for (delay, format) in [
            (None, FORMAT_MILLIS),
            (Some(Duration::from_millis(1500)), FORMAT_MILLIS),
            (Some(Duration::from_micros(1500)), FORMAT),
            (Some(Duration::from_millis(u64::MAX)), FORMAT),
        ] {
            let mut message = Message::builder();
            if let Some(delay) = delay {
                message = message.delay(delay);
            }
            let bytes = encode(&message.payload("x"));
            assert_eq!(bytes[0], format, "{delay:?}");
            assert_eq!(decode(&bytes).unwrap().delay(), delay);
        }
    }

    #[test]
    fn bytes_that_are_no_record_are_refused() {
        let good = encode(&Message::new("hello"));
        for bad in [&[][..], &[9][..], &good[..good.len() - 1]] {
            assert!(matches!(decode(bad), Err(Error::Config(_))));
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());

        // A delay of a billion nanoseconds or more is no `encode` made.
        let delayed = encode(&Message::builder().delay(Duration::MAX).payload("x"));
        let nanos = 1 + 5 + 1 + 8;
        let mut carried = delayed.clone();
        carried[nanos..nanos + 4].copy_from_slice(&1_000_000_000u32.to_be_bytes());
        assert!(matches!(decode(&carried), Err(Error::Config(_))));
        assert!(decode(&delayed).is_ok());
    }
}
