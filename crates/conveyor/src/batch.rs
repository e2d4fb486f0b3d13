//! Batches of payloads for batch handlers, and their outcomes.

use std::ops::Deref;

use crate::error::BoxError;
use crate::message::PartitionKey;
use crate::outcome::Outcome;

/// The decoded payloads of one batch, in the order received, never empty.
///
/// A delivery whose payload cannot be decoded is rejected on its own and left out, so a
/// batch handler sees only payloads it can use.
#[derive(Debug)]
pub struct Batch<P> {
    items: Vec<P>,
    keys: Vec<Option<PartitionKey>>,
}

impl<P> Batch<P> {
    pub(crate) fn new(items: Vec<P>, keys: Vec<Option<PartitionKey>>) -> Self {
        Batch { items, keys }
    }

    /// The partition key of element `index`, if its message has one.
    pub fn partition_key(&self, index: usize) -> Option<&PartitionKey> {
        self.keys.get(index).and_then(Option::as_ref)
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

/// What a batch handler decided: one outcome for the whole batch, or one per element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// The same outcome for every element.
    All(Outcome),
    /// One outcome per element, in the batch's order.
    Each(Vec<Outcome>),
}

/// Turns what a batch handler returns into a [`BatchOutcome`], or an error that the
/// mount's failure policy applies to every element.
///
/// Implemented for `()`, [`Outcome`], `Vec<Outcome>`, [`BatchOutcome`] and `Result`s of
/// them. A `Vec` whose length differs from the batch's counts as an error.
pub trait IntoBatchOutcome {
    /// The outcome, or the handler's error.
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError>;
}

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

impl IntoBatchOutcome for BatchOutcome {
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError> {
        Ok(self)
    }
}

impl<T: IntoBatchOutcome, E: Into<BoxError>> IntoBatchOutcome for Result<T, E> {
    fn into_batch_outcome(self) -> Result<BatchOutcome, BoxError> {
        self.map_err(Into::into)?.into_batch_outcome()
    }
}
