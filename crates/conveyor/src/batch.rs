//! Batches of payloads for batch handlers, and their outcomes.

use std::ops::Deref;

use crate::delivery::Delivery;
use crate::error::BoxError;
use crate::extract::DeliveryInfo;
use crate::headers::Headers;
use crate::message::PartitionKey;
use crate::outcome::Outcome;

/// The decoded payloads of one batch, in the order received, never empty, with what a
/// single handler's extractors would see of each: its [`DeliveryInfo`], headers and
/// partition key.
///
/// A delivery whose payload cannot be decoded is rejected on its own and left out, so a
/// batch handler sees only payloads it can use.
///
/// ```
/// use conveyor::{Batch, Json, Outcome};
///
/// // Retries the elements seen for the first time, acks the others.
/// async fn import(batch: Batch<Json<u64>>) -> Vec<Outcome> {
///     (0..batch.len())
///         .map(|i| match batch.info(i) {
///             Some(info) if info.attempt == 1 => Outcome::Retry,
///             _ => Outcome::Ack,
///         })
///         .collect()
/// }
/// ```
#[derive(Debug)]
pub struct Batch<P> {
    items: Vec<P>,
    metadata: Vec<Metadata>,
}

/// What a batch keeps of each element's delivery; all of it is reference-counted, so
/// keeping it costs no copy.
#[derive(Debug)]
pub(crate) struct Metadata {
    info: DeliveryInfo,
    headers: Headers,
    key: Option<PartitionKey>,
}

impl Metadata {
    pub(crate) fn of(delivery: &Delivery) -> Self {
        Metadata {
            info: DeliveryInfo::of(delivery),
            headers: delivery.headers().clone(),
            key: delivery.partition_key().cloned(),
        }
    }
}

impl<P> Batch<P> {
    pub(crate) fn new(items: Vec<P>, metadata: Vec<Metadata>) -> Self {
        Batch { items, metadata }
    }

    /// The partition key of element `index`, if its message has one.
    pub fn partition_key(&self, index: usize) -> Option<&PartitionKey> {
        self.metadata.get(index).and_then(|m| m.key.as_ref())
    }

    /// The delivery information of element `index` (queue, receive count, attempt), as
    /// the [`DeliveryInfo`] extractor gives a single handler.
    pub fn info(&self, index: usize) -> Option<&DeliveryInfo> {
        self.metadata.get(index).map(|m| &m.info)
    }

    /// The headers of element `index`.
    pub fn headers(&self, index: usize) -> Option<&Headers> {
        self.metadata.get(index).map(|m| &m.headers)
    }

    /// The payloads, owned.
    pub fn into_vec(self) -> Vec<P> {
        self.items
    }
}

impl<P> Deref for Batch<P> {
    type Target = [P];
    fn deref(&self) -> &[P] {
        &self.items
    }
}

impl<P> IntoIterator for Batch<P> {
    type Item = P;
    type IntoIter = std::vec::IntoIter<P>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a, P> IntoIterator for &'a Batch<P> {
    type Item = &'a P;
    type IntoIter = std::slice::Iter<'a, P>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

pub(crate) use sealed::BatchOutcome;

/// Public in name, because [`IntoBatchOutcome`] mentions them, but in a private module:
/// a batch handler speaks the one outcome vocabulary, [`Outcome`], for the whole batch or
/// per element, and nothing outside the crate can name or add to these.
mod sealed {
    use super::Outcome;

    /// What a batch handler decided: one outcome for the whole batch, or one per element.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum BatchOutcome {
        /// The same outcome for every element.
        All(Outcome),
        /// One outcome per element, in the batch's order.
        Each(Vec<Outcome>),
    }

    /// Seals [`IntoBatchOutcome`](super::IntoBatchOutcome).
    pub trait Sealed {}
}

/// What a batch handler may return: `()` (ack all), an [`Outcome`] for the whole batch,
/// a `Vec<Outcome>` with one per element in the batch's order, or a `Result` of one of
/// them, whose `Err` the mount's failure policy applies to every element. A `Vec` whose
/// length differs from the batch's counts as an error. Sealed: these are the shapes.
pub trait IntoBatchOutcome: sealed::Sealed {
    /// The outcome, or the handler's error.
    #[doc(hidden)]
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError>;
}

impl sealed::Sealed for () {}
impl sealed::Sealed for Outcome {}
impl sealed::Sealed for Vec<Outcome> {}
impl<T: IntoBatchOutcome, E: Into<BoxError>> sealed::Sealed for Result<T, E> {}

impl IntoBatchOutcome for () {
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError> {
        Ok(BatchOutcome::All(Outcome::Ack))
    }
}

impl IntoBatchOutcome for Outcome {
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError> {
        Ok(BatchOutcome::All(self))
    }
}

impl IntoBatchOutcome for Vec<Outcome> {
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError> {
        Ok(BatchOutcome::Each(self))
    }
}

impl<T: IntoBatchOutcome, E: Into<BoxError>> IntoBatchOutcome for Result<T, E> {
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError> {
        self.map_err(Into::into)?.into_batch_outcome()
    }
}
