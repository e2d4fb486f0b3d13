//! Decoding a delivery's payload into a handler's first argument.
//!
//! The first argument of a handler names the codec: [`Json<T>`] decodes JSON with serde,
//! [`Bytes`] and `Vec<u8>` take the raw payload, `String` takes it as UTF-8; with their
//! cargo features, `MsgPack<T>` (`msgpack`) and `Cbor<T>` (`cbor`) decode the binary
//! formats. Implement [`FromPayload`] to add a codec (protobuf, Avro, ...).
//!
//! A codec may name the content types it reads ([`FromPayload::FORMAT`]). Where it
//! checks them, a delivery labelled with another content type is rejected before
//! decoding, with a reason that names both, unless the mount takes any
//! ([`MountOptions::any_content_type`](crate::MountOptions::any_content_type)). A
//! delivery that carries no content type is always decoded: not every producer labels
//! its messages.

use std::fmt;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::delivery::Delivery;
use crate::error::BoxError;
use crate::extract::Context;
use crate::message::{CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE};

/// A payload that could not be decoded. The delivery is rejected (dead-lettered where the
/// queue has a dead-letter queue) with this as the reason, and one error is logged.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode payload as {format}")]
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

    /// A delivery labelled `found`, which `format` does not read.
    fn unexpected_content_type(format: &PayloadFormat, found: &str) -> Self {
        let reads = format.content_types.join(", ");
        DecodeError::new(
            format.name,
            format!(
                "its content type is `{found}`, and {} reads {reads}",
                format.name
            ),
        )
    }
}

/// The format a payload type reads: its name and content types, for decode errors, for
/// the content-type check and for what describes the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PayloadFormat {
    /// A short name, as decode errors give it (`json`, `msgpack`, ...).
    pub name: &'static str,
    /// The content types of the format, the usual one first; compared without
    /// parameters (`; charset=...`) and case.
    pub content_types: &'static [&'static str],
    /// Whether a delivery labelled with another content type is rejected before it is
    /// decoded (unless the mount takes any content type).
    pub checked: bool,
}

impl PayloadFormat {
    /// A format named `name` that reads `content_types` and rejects others.
    pub const fn checked(name: &'static str, content_types: &'static [&'static str]) -> Self {
        PayloadFormat {
            name,
            content_types,
            checked: true,
        }
    }

    /// A format named `name` whose usual content types are `content_types`, which
    /// decodes a delivery whatever its label.
    pub const fn unchecked(name: &'static str, content_types: &'static [&'static str]) -> Self {
        PayloadFormat {
            name,
            content_types,
            checked: false,
        }
    }

    /// Whether the format reads `content_type` (parameters and case aside).
    pub fn reads(&self, content_type: &str) -> bool {
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        self.content_types
            .iter()
            .any(|known| known.eq_ignore_ascii_case(essence))
    }
}

/// A type a handler can take its payload as.
///
/// ```
/// use conveyor::{Bytes, DecodeError, FromPayload, PayloadFormat};
///
/// /// A payload in a format of the team's own.
/// struct Csv(Vec<String>);
///
/// impl FromPayload for Csv {
///     const FORMAT: Option<PayloadFormat> = Some(PayloadFormat::checked("csv", &["text/csv"]));
///
///     fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
///         let text = std::str::from_utf8(payload).map_err(|e| DecodeError::new("csv", e))?;
///         Ok(Csv(text.split(',').map(str::to_string).collect()))
///     }
/// }
/// ```
pub trait FromPayload: Sized + Send + 'static {
    /// The format this type reads, if it reads one: where it is
    /// [checked](PayloadFormat::checked), a delivery labelled with a content type of
    /// another format is rejected before [`from_payload`](Self::from_payload) is called.
    /// `None` (the default): every payload is given to `from_payload`.
    const FORMAT: Option<PayloadFormat> = None;

    /// Decodes the payload.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`]: the delivery is rejected with it as the reason.
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError>;
}

/// Raw bytes: any payload, described as the generic binary type.
const RAW: PayloadFormat = PayloadFormat::unchecked("bytes", &["application/octet-stream"]);

/// Decodes `delivery`'s payload as `P`, after checking its content type where `P`'s
/// format asks for it and the mount does not take any.
pub(crate) fn decode<P: FromPayload>(delivery: &Delivery, cx: &Context) -> Result<P, DecodeError> {
    // A constant per payload type: a codec that checks nothing pays nothing here.
    if let Some(format) = P::FORMAT.filter(|format| format.checked) {
        let found = delivery.headers().get_str(CONTENT_TYPE_HEADER);
        if let Some(found) = found.filter(|found| !cx.any_content_type() && !format.reads(found)) {
            return Err(DecodeError::unexpected_content_type(&format, found));
        }
    }
    P::from_payload(delivery.payload())
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

/// JSON is decoded whatever the delivery's label: many producers send it as `text/plain`
/// or with no content type at all.
impl<T: DeserializeOwned + Send + 'static> FromPayload for Json<T> {
    const FORMAT: Option<PayloadFormat> =
        Some(PayloadFormat::unchecked("json", &[JSON_CONTENT_TYPE]));

    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        serde_json::from_slice(payload)
            .map(Json)
            .map_err(|e| DecodeError::new("json", e))
    }
}

/// The raw bytes, whatever their label; described as `application/octet-stream`.
impl FromPayload for Bytes {
    const FORMAT: Option<PayloadFormat> = Some(RAW);

    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        Ok(payload.clone())
    }
}

/// The raw bytes, whatever their label; described as `application/octet-stream`.
impl FromPayload for Vec<u8> {
    const FORMAT: Option<PayloadFormat> = Some(RAW);

    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        Ok(payload.to_vec())
    }
}

/// UTF-8 text, whatever its label; described as `text/plain`.
impl FromPayload for String {
    const FORMAT: Option<PayloadFormat> = Some(PayloadFormat::unchecked("utf-8", &["text/plain"]));

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
