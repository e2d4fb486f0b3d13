//! SQS data types of message attributes, where a header's bytes alone do not say them.
//!
//! A header goes out as a `String` attribute when SQS takes its bytes as text, else as
//! `Binary` ([`sent_as`]). SQS has more: `Number`, and custom types after a dot
//! (`String.json`, `Number.float`, `Binary.gzip`). A received message keeps those of its
//! attributes in an [`AttributeTypes`], so that a dead-lettered or redriven copy goes out
//! with the types it came with, and a publisher can name them.

use std::fmt;

use conveyor::Delivery;

/// The longest data type SQS takes, custom part included, in characters.
const MAX_DATA_TYPE_CHARS: usize = 256;

/// The SQS data types of message attributes, by attribute name, for the attributes whose
/// type is not the one Conveyor would send their value as: `String` for a value SQS takes
/// as text, `Binary` for any other. That is, `Number` attributes, attributes of a custom
/// type (`String.json`, `Number.float`, `Binary.gzip`), and `Binary` attributes that hold
/// text.
///
/// A received message's types come with [`attribute_types`](crate::attribute_types); a
/// dead-lettered message keeps them on its own. To publish with types, give them to
/// [`SqsBroker::publish_typed`](crate::SqsBroker::publish_typed):
///
/// ```
/// use conveyor_sqs::AttributeTypes;
///
/// let types = AttributeTypes::new().with("price", "Number").with("tags", "String.Array");
/// assert_eq!(types.get("price"), Some("Number"));
/// assert_eq!(types.get("sku"), None);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AttributeTypes {
    /// Attribute names (as SQS spells them: names are case-sensitive there) and types,
    /// by name.
    types: Vec<(String, String)>,
}

impl AttributeTypes {
    /// No types: every attribute goes as Conveyor would send it.
    pub fn new() -> Self {
        AttributeTypes::default()
    }

    /// Sends the attribute `name` as `data_type`, replacing a type given before.
    /// Checked when a message is published, as SQS checks it: a type must be `String`,
    /// `Number` or `Binary`, optionally followed by a dot and a custom label (of the
    /// characters SQS takes in a body), at most 256 characters in all, and a `Number`
    /// value must be a number.
    pub fn with(mut self, name: impl Into<String>, data_type: impl Into<String>) -> Self {
        self.insert(name.into(), data_type.into());
        self
    }

    /// Sends the attribute `name` as its value alone says again: for a header whose
    /// value a copy changes (a `Number` message id that becomes text, say).
    pub fn without(mut self, name: &str) -> Self {
        if let Ok(at) = self.position(name) {
            self.types.remove(at);
        }
        self
    }

    fn insert(&mut self, name: String, data_type: String) {
        match self.position(&name) {
            Ok(at) => self.types[at].1 = data_type,
            Err(at) => self.types.insert(at, (name, data_type)),
        }
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.types
            .binary_search_by(|(known, _)| known.as_str().cmp(name))
    }

    /// The type given for the attribute `name`, if any.
    pub fn get(&self, name: &str) -> Option<&str> {
        let at = self.position(name).ok()?;
        self.types.get(at).map(|(_, data_type)| data_type.as_str())
    }

    /// Whether no type is given.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Each attribute name with its type, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.types
            .iter()
            .map(|(name, data_type)| (name.as_str(), data_type.as_str()))
    }

    /// Notes that a received attribute `name` of type `data_type` holds `value`: kept
    /// only if Conveyor would send `value` as another type.
    pub(crate) fn note_received(&mut self, name: &str, data_type: &str, value: &[u8]) {
        if data_type != sent_as(value) {
            self.insert(name.to_string(), data_type.to_string());
        }
    }
}

impl fmt::Debug for AttributeTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The types of the message attributes `delivery` was received with, where their values
/// alone would go out as another type (see [`AttributeTypes`]), if it came from SQS and is
/// not settled yet. `None` for another transport's delivery.
///
/// ```no_run
/// # async fn f(broker: conveyor_sqs::SqsBroker, delivery: conveyor::Delivery) -> Result<(), conveyor::Error> {
/// use conveyor::Message;
///
/// // A copy for an audit queue, its `Number` attributes still numbers.
/// let types = conveyor_sqs::attribute_types(&delivery).unwrap_or_default();
/// let copy = Message::received(delivery.payload().clone(), delivery.headers().clone());
/// broker.publish_typed("audit", copy, &types).await?;
/// # Ok(()) }
/// ```
pub fn attribute_types(delivery: &Delivery) -> Option<AttributeTypes> {
    delivery.transport_record::<AttributeTypes>()
}

/// The type Conveyor sends `value` as when no type is given: `String` where SQS takes it
/// as text, `Binary` otherwise.
pub(crate) fn sent_as(value: &[u8]) -> &'static str {
    match std::str::from_utf8(value) {
        Ok(text) if as_sqs_text(text) => "String",
        _ => "Binary",
    }
}

/// Whether SQS takes `text` as a `String` value: not empty, and only the characters it
/// allows.
pub(crate) fn as_sqs_text(text: &str) -> bool {
    !text.is_empty() && text.chars().all(sqs_allows)
}

/// The characters SQS accepts in a body or string attribute.
pub(crate) fn sqs_allows(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// How an attribute of a given type carries its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carried {
    /// `StringValue`: a `String` or `Number` type.
    Text,
    /// `BinaryValue`: a `Binary` type.
    Bytes,
}

/// How an attribute of `data_type` carries its value, or why SQS would refuse the type.
pub(crate) fn carried(data_type: &str) -> Result<Carried, String> {
    let (base, custom) = match data_type.split_once('.') {
        Some((base, custom)) => (base, Some(custom)),
        None => (data_type, None),
    };
    let carried = match base {
        "String" | "Number" => Carried::Text,
        "Binary" => Carried::Bytes,
        _ => {
            return Err(format!(
                "data type `{}` is not String, Number or Binary (with an optional `.custom` part)",
                data_type.escape_debug()
            ));
        }
    };
    // SQS takes in a custom label what it takes in a body.
    if let Some(custom) = custom
        && !as_sqs_text(custom)
    {
        return Err(format!(
            "the custom label of data type `{}` is empty or holds a character SQS refuses",
            data_type.escape_debug()
        ));
    }
    if data_type.chars().nth(MAX_DATA_TYPE_CHARS).is_some() {
        return Err(format!(
            "a data type is at most {MAX_DATA_TYPE_CHARS} characters"
        ));
    }
    Ok(carried)
}

/// Whether `data_type` is a `Number` one.
pub(crate) fn is_number(data_type: &str) -> bool {
    data_type == "Number" || data_type.starts_with("Number.")
}

/// Whether `text` is a value SQS could take as a `Number`: a finite decimal number.
pub(crate) fn is_numeric(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    digits.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && text.parse::<f64>().is_ok_and(f64::is_finite)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_type_is_kept_only_where_the_value_alone_would_go_as_another() {
        let mut types = AttributeTypes::new();
        types.note_received("plain", "String", b"text");
        types.note_received("raw", "Binary", &[0xff, 0x00]);
        types.note_received("price", "Number", b"12.5");
        types.note_received("json", "String.json", b"{}");
        types.note_received("texty", "Binary", b"looks like text");
        assert_eq!(types.get("plain"), None);
        assert_eq!(types.get("raw"), None);
        assert_eq!(types.get("price"), Some("Number"));
        assert_eq!(types.get("json"), Some("String.json"));
        assert_eq!(types.get("texty"), Some("Binary"));
        assert_eq!(types.iter().count(), 3);
    }

    #[test]
    fn a_type_given_again_replaces_the_first_and_one_taken_out_is_gone() {
        let types = AttributeTypes::new()
            .with("n", "Number")
            .with("n", "Number.int")
            .with("m", "Number");
        assert_eq!(
            types.iter().collect::<Vec<_>>(),
            [("m", "Number"), ("n", "Number.int")]
        );
        let types = types.without("n").without("absent");
        assert_eq!(types.iter().collect::<Vec<_>>(), [("m", "Number")]);
    }

    #[test]
    fn data_types_are_checked_as_sqs_would() {
        assert_eq!(carried("String"), Ok(Carried::Text));
        assert_eq!(carried("Number.float"), Ok(Carried::Text));
        assert_eq!(carried("Binary.gzip"), Ok(Carried::Bytes));
        assert_eq!(carried("String.a-b_c.d"), Ok(Carried::Text));
        // Received from SQS, which takes a label of any text it takes in a body.
        assert_eq!(carried("String.application/json"), Ok(Carried::Text));
        assert_eq!(carried("Binary.image png é"), Ok(Carried::Bytes));
        for refused in ["", "string", "Int", "Number.", "String.\u{1}"] {
            assert!(carried(refused).is_err(), "{refused:?} was taken");
        }
        assert!(carried(&format!("String.{}", "x".repeat(250))).is_err());
        assert!(carried(&format!("String.{}", "x".repeat(249))).is_ok());
    }

    #[test]
    fn only_finite_decimal_numbers_are_numbers() {
        for number in ["0", "-12", "+3.5", ".5", "1e5", "12345678901234567890"] {
            assert!(is_numeric(number), "{number:?} was refused");
        }
        for refused in ["", "abc", "NaN", "inf", "-infinity", "1e999", "0x10", " 1"] {
            assert!(!is_numeric(refused), "{refused:?} was taken");
        }
    }
}
