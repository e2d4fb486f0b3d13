//! Binary payload formats beside JSON, each behind its cargo feature: MessagePack
//! (`MsgPack<T>`, feature `msgpack`, over `rmp-serde`) and CBOR (`Cbor<T>`, feature
//! `cbor`, over `ciborium`).
//!
//! Publish with `Message::msgpack` or `Message::cbor` (or the builder's methods of the
//! same names), which set the content type; take the payload as `MsgPack<T>` or `Cbor<T>`. Both check
//! the content type: a delivery labelled with another one is rejected with a reason that
//! names both, unless the mount says
//! [`any_content_type`](crate::MountOptions::any_content_type). A delivery with no
//! content type is decoded. The bodies are binary; every transport carries them byte for
//! byte (SQS, whose bodies are text, as base64 marked by an attribute).
//!
//! ```
//! # #[cfg(feature = "msgpack")] {
//! use conveyor::{Message, MsgPack};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Reading { sensor: u32, celsius: f32 }
//!
//! async fn record(MsgPack(reading): MsgPack<Reading>) {
//!     println!("sensor {}: {} °C", reading.sensor, reading.celsius);
//! }
//!
//! let message = Message::msgpack(&Reading { sensor: 7, celsius: 21.5 })?;
//! assert_eq!(message.content_type(), Some("application/msgpack"));
//! # }
//! # Ok::<(), conveyor::Error>(())
//! ```

pub use crate::encode::{CBOR_CONTENT_TYPE, MSGPACK_CONTENT_TYPE};
#[cfg(any(feature = "msgpack", feature = "cbor"))]
use {
    crate::payload::{DecodeError, FromPayload, PayloadFormat},
    bytes::Bytes,
    serde::de::DeserializeOwned,
    std::fmt,
};

/// A MessagePack payload, decoded with serde (feature `msgpack`). It reads
/// `application/msgpack` and the older `application/x-msgpack` and
/// `application/vnd.msgpack`; structs may come as maps (as
/// [`Message::msgpack`](crate::Message::msgpack) writes them) or arrays.
#[cfg(feature = "msgpack")]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct MsgPack<T>(pub T);

#[cfg(feature = "msgpack")]
impl<T: fmt::Debug> fmt::Debug for MsgPack<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(feature = "msgpack")]
impl<T: DeserializeOwned + Send + 'static> FromPayload for MsgPack<T> {
    const FORMAT: Option<PayloadFormat> = Some(PayloadFormat::checked(
        "msgpack",
        &[
            MSGPACK_CONTENT_TYPE,
            "application/x-msgpack",
            "application/vnd.msgpack",
        ],
    ));

    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        rmp_serde::from_slice(payload)
            .map(MsgPack)
            .map_err(|e| DecodeError::new("msgpack", e))
    }
}

/// A CBOR payload (RFC 8949), decoded with serde (feature `cbor`). It reads
/// `application/cbor`.
#[cfg(feature = "cbor")]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Cbor<T>(pub T);

#[cfg(feature = "cbor")]
impl<T: fmt::Debug> fmt::Debug for Cbor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(feature = "cbor")]
impl<T: DeserializeOwned + Send + 'static> FromPayload for Cbor<T> {
    const FORMAT: Option<PayloadFormat> =
        Some(PayloadFormat::checked("cbor", &[CBOR_CONTENT_TYPE]));

    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        ciborium::from_reader(payload.as_ref())
            .map(Cbor)
            .map_err(|e| DecodeError::new("cbor", e))
    }
}

#[cfg(all(test, feature = "msgpack", feature = "cbor"))]
mod tests {
    use super::*;
    use crate::Message;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Reading {
        sensor: u32,
        label: String,
        celsius: f64,
    }

    fn reading() -> Reading {
        Reading {
            sensor: 7,
            label: "café".into(),
            celsius: 21.5,
        }
    }

    #[test]
    fn msgpack_round_trips_and_writes_structs_as_maps() {
        let message = Message::msgpack(&reading()).expect("encodes");
        assert_eq!(message.content_type(), Some(MSGPACK_CONTENT_TYPE));
        // A map of three (0x83), not an array: readable without the struct's field order.
        assert_eq!(message.payload()[0], 0x83);
        let MsgPack(back) = MsgPack::<Reading>::from_payload(message.payload()).expect("decodes");
        assert_eq!(back, reading());
    }

    #[test]
    fn msgpack_reads_structs_written_as_arrays() {
        let compact = Bytes::from(rmp_serde::to_vec(&reading()).expect("encodes"));
        assert_eq!(compact[0], 0x93);
        let MsgPack(back) = MsgPack::<Reading>::from_payload(&compact).expect("decodes");
        assert_eq!(back, reading());
    }

    #[test]
    fn cbor_round_trips() {
        let message = Message::cbor(&reading()).expect("encodes");
        assert_eq!(message.content_type(), Some(CBOR_CONTENT_TYPE));
        let Cbor(back) = Cbor::<Reading>::from_payload(message.payload()).expect("decodes");
        assert_eq!(back, reading());
    }

    #[test]
    fn a_payload_of_another_format_names_the_format_that_failed() {
        let json = Bytes::from_static(br#"{"sensor":7}"#);
        let error = Cbor::<Reading>::from_payload(&json).unwrap_err();
        assert_eq!(error.format(), "cbor");
        let error = MsgPack::<Reading>::from_payload(&json).unwrap_err();
        assert_eq!(error.format(), "msgpack");
    }

    #[test]
    fn the_formats_read_their_content_types_without_parameters_or_case() {
        let Some(msgpack) = MsgPack::<Reading>::FORMAT else {
            panic!("msgpack names its format");
        };
        assert!(msgpack.reads("application/msgpack"));
        assert!(msgpack.reads("Application/X-MsgPack; charset=binary"));
        assert!(!msgpack.reads("application/json"));
        let Some(cbor) = Cbor::<Reading>::FORMAT else {
            panic!("cbor names its format");
        };
        assert!(cbor.checked && cbor.reads("application/cbor"));
        assert!(!cbor.reads("application/msgpack"));
    }
}
