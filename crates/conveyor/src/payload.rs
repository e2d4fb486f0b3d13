//! Decoding a delivery's payload into a handler's first argument.
//!
//! The first argument of a handler names the codec: [`Json<T>`] decodes JSON with serde,
//! [`Bytes`] and `Vec<u8>` take the raw payload, `String` takes it as UTF-8. Implement
//! [`FromPayload`] to add a codec (protobuf, MessagePack, ...).

use std::fmt;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::BoxError;

/// A payload that could not be decoded. The delivery is rejected (dead-lettered where the
/// queue has a dead-letter queue) with this as the reason, and one error is logged.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode payload as {format}: {source}")]
pub struct DecodeError {
    format: &'static str,
    #[source]
    source: BoxError,
}

impl DecodeError {
    /// A decode error for `format` caused by `source`.
    pub fn new(format: &'static str, source: impl Into<BoxError>) -> Self {
        DecodeError {
            format,
            source: source.into(),
        }
    }

    /// The format that failed to decode (`json`, `utf-8`, ...).
    pub fn format(&self) -> &'static str {
        self.format
    }
}

/// A type a handler can take its payload as.
pub trait FromPayload: Sized + Send + 'static {
    /// Decodes the payload.
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError>;
}

/// A JSON payload, decoded with serde.
///
/// ```
/// use conveyor::Json;
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
///
/// async fn handle(Json(order): Json<Order>) {
///     println!("order {}", order.id);
/// }
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: fmt::Debug> fmt::Debug for Json<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: DeserializeOwned + Send + 'static> FromPayload for Json<T> {
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        serde_json::from_slice(payload)
            .map(Json)
            .map_err(|e| DecodeError::new("json", e))
    }
}

impl FromPayload for Bytes {
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        Ok(payload.clone())
    }
}

impl FromPayload for Vec<u8> {
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        Ok(payload.to_vec())
    }
}

impl FromPayload for String {
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        String::from_utf8(payload.to_vec()).map_err(|e| DecodeError::new("utf-8", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Order {
        id: u64,
    }

    #[test]
    fn json_decodes_with_serde() {
        let Json(order) =
            Json::<Order>::from_payload(&Bytes::from_static(br#"{"id":3}"#)).expect("valid json");
        assert_eq!(order, Order { id: 3 });
    }

    #[test]
    fn bad_json_names_the_format() {
        let err = Json::<Order>::from_payload(&Bytes::from_static(b"{")).unwrap_err();
        assert_eq!(err.format(), "json");
        assert!(err.to_string().starts_with("cannot decode payload as json"));
    }

    #[test]
    fn string_requires_utf8() {
        assert!(String::from_payload(&Bytes::from_static(&[0xff])).is_err());
        assert_eq!(
            String::from_payload(&Bytes::from_static(b"hi")).unwrap(),
            "hi"
        );
    }
}
