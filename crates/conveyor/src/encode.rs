//! Encoding a value into a message's payload in the binary formats: a leaf below
//! [`Message`](crate::Message), which only needs to encode; decoding, with the payload
//! extractors, is in [`codec`](crate::codec).

/// The content type `Message::msgpack` sets.
pub const MSGPACK_CONTENT_TYPE: &str = "application/msgpack";

/// The content type `Message::cbor` sets.
pub const CBOR_CONTENT_TYPE: &str = "application/cbor";

/// Encodes `value` as MessagePack, structs as maps of their field names: what other
/// languages' MessagePack libraries read without a schema.
#[cfg(feature = "msgpack")]
pub(crate) fn to_msgpack<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, crate::Error> {
    rmp_serde::to_vec_named(value).map_err(|e| crate::Error::Encode {
        format: "msgpack",
        source: e.into(),
    })
}

/// Encodes `value` as CBOR.
#[cfg(feature = "cbor")]
pub(crate) fn to_cbor<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, crate::Error> {
    let mut out = Vec::new();
    ciborium::into_writer(value, &mut out).map_err(|e| crate::Error::Encode {
        format: "cbor",
        source: e.into(),
    })?;
    Ok(out)
}
