//! An app's AsyncAPI 3.0 document, made from its mounts: [`App::asyncapi`].
//!
//! The document has a channel per mounted queue and per `publish_to` destination (a
//! queue of one name on two kinds of broker is two channels, `orders` and `orders_2`), a
//! `receive` operation per mount and a `send` operation per destination, and for each
//! message its content type (from the payload type's [`PayloadFormat`](crate::PayloadFormat)), its name (the
//! payload type's), the partition key as a documented header, the correlation id's
//! location, and the broker's bindings (AMQP 0.3.0 for RabbitMQ, SQS 0.2.0 for SQS, from
//! [`Source::describe`](crate::Source::describe)). Each `receive` operation carries the
//! mount's dispatch mode and failure policy as `x-conveyor-dispatch` and
//! `x-conveyor-failure-policy`.
//!
//! Payload schemas come from `schemars` (cargo feature `schemars`): name the payload's
//! type at the mount site with `MountOptions::payload_schema::<T>()`, and what the
//! handler publishes with `MountOptions::output_schema::<T>()`; the schemas land in
//! `components.schemas` and the messages refer to them. (Rust cannot ask of any payload
//! type whether it has a schema, so the mount names it.) Without them, a message
//! still names its payload type and content type. Messages sent to a destination chosen
//! at run time (`Output::to`) or published outside handlers are not in the document.
//!
//! [`App::asyncapi`]: crate::App::asyncapi
//!
//! ```
//! use conveyor::{App, Json, MemoryBroker};
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! async fn place(Json(order): Json<Order>) {}
//!
//! let broker = MemoryBroker::new();
//! let app = App::new("orders")
//!     .version("1.4.0")
//!     .mount(broker.queue("orders"), place, |m| m.workers(4).by_key());
//! let document = app.asyncapi().into_json();
//! assert_eq!(document["asyncapi"], "3.0.0");
//! assert_eq!(document["channels"]["orders"]["address"], "orders");
//! assert_eq!(document["operations"]["receive_orders"]["x-conveyor-dispatch"]["mode"], "lanes");
//! ```

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::handler::PayloadInfo;
use crate::mount::{Dispatch, MountOptions};
use crate::policy::{FailurePolicy, OnError};

/// The AsyncAPI version of the documents made here.
pub const ASYNCAPI_VERSION: &str = "3.0.0";

pub use crate::transport::QueueDescription;

/// An AsyncAPI 3.0 document, as JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct Document(Value);

impl Document {
    /// The document as a JSON value.
    pub fn as_json(&self) -> &Value {
        &self.0
    }

    /// The document as a JSON value, owned.
    pub fn into_json(self) -> Value {
        self.0
    }

    /// The document as indented JSON text, ready for a file.
    pub fn to_pretty_string(&self) -> String {
        // A `Value` always serializes.
        serde_json::to_string_pretty(&self.0).unwrap_or_default()
    }
}

impl serde::Serialize for Document {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// What the document needs of one mount.
pub(crate) struct MountDescription<'a> {
    pub(crate) queue: &'a str,
    /// The messaging system of the mounted queue's broker
    /// ([`Source::messaging_system`](crate::Source::messaging_system)); the
    /// `publish_to` destination is on it too, unless the outputs go through another
    /// broker's publisher.
    pub(crate) system: &'a str,
    pub(crate) options: &'a MountOptions,
    pub(crate) payload: PayloadInfo,
    pub(crate) batch: bool,
    /// How the transport describes the mounted queue.
    pub(crate) received: &'a QueueDescription,
    /// How the transport describes the `publish_to` destination (none when the outputs
    /// go through another broker's publisher).
    pub(crate) sent: Option<&'a QueueDescription>,
}

/// The document of an app named `title` at `version` with these mounts.
pub(crate) fn document<'a>(
    title: &str,
    version: &str,
    mounts: impl IntoIterator<Item = MountDescription<'a>>,
) -> Document {
    let mut builder = Builder::default();
    for mount in mounts {
        builder.mount(&mount);
    }
    builder.finish(title, version)
}

/// Where a channel's queue is: the address alone would make one channel of two brokers'
/// queues of one name, and give the second broker's operations the first one's bindings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ChannelKey {
    /// The broker's messaging system; `None` when it is not known (outputs through
    /// another broker's publisher).
    system: Option<String>,
    /// The channel's bindings (protocol and binding object, as text): two transports
    /// that share a system name yet describe the queue differently are two channels.
    binding: Option<String>,
    address: String,
}

#[derive(Default)]
struct Builder {
    channels: Map<String, Value>,
    operations: Map<String, Value>,
    /// The channel id of each queue, by where it is ([`ChannelKey`]).
    addresses: HashMap<ChannelKey, String>,
    #[cfg(feature = "schemars")]
    schemas: Option<schemars::SchemaGenerator>,
}

impl Builder {
    fn mount(&mut self, mount: &MountDescription<'_>) {
        let channel = self.channel(Some(mount.system), mount.queue, mount.received);
        let message = self.received_message(&channel, mount);
        let mut operation = Map::new();
        operation.insert("action".into(), json!("receive"));
        operation.insert("channel".into(), reference(&["channels", &channel]));
        operation.insert("messages".into(), json!([message]));
        if let Some((protocol, binding)) = &mount.received.receive_binding {
            operation.insert("bindings".into(), json!({ *protocol: binding }));
        }
        operation.insert(
            "x-conveyor-dispatch".into(),
            dispatch(mount.options, mount.batch),
        );
        operation.insert(
            "x-conveyor-failure-policy".into(),
            failure_policy(&mount.options.failure_policy()),
        );
        if let Some(limit) = mount.options.handler_timeout() {
            operation.insert("x-conveyor-timeout-ms".into(), json!(millis(limit)));
        }
        if mount.options.takes_any_content_type() {
            operation.insert("x-conveyor-any-content-type".into(), json!(true));
        }
        let id = self.operation_id("receive", &channel);
        self.operations.insert(id, Value::Object(operation));

        if let Some(destination) = mount.options.output_destination() {
            let unknown = QueueDescription::default();
            let sent = mount.sent.unwrap_or(&unknown);
            // Through another broker's publisher, the destination's broker is unknown:
            // it is none of the mounted brokers' queues of that name.
            let system = mount.sent.map(|_| mount.system);
            let channel = self.channel(system, destination, sent);
            let message = self.sent_message(&channel, mount, sent);
            let mut operation = Map::new();
            operation.insert("action".into(), json!("send"));
            operation.insert("channel".into(), reference(&["channels", &channel]));
            operation.insert("messages".into(), json!([message]));
            if let Some((protocol, binding)) = &sent.send_binding {
                operation.insert("bindings".into(), json!({ *protocol: binding }));
            }
            operation.insert("x-conveyor-published-by".into(), json!(mount.queue));
            let id = self.operation_id("send", &channel);
            self.operations.insert(id, Value::Object(operation));
        }
    }

    /// The id of the channel at `address` on a broker of `system` (`None`: unknown),
    /// made on first sight. A queue of one name on two kinds of broker is two
    /// channels (`orders`, `orders_2`), each with its own bindings; two brokers of one
    /// kind describe a queue alike, and share its channel. A destination of unknown
    /// broker (sent through `publish_via`) is the channel of a mounted queue of its name,
    /// if there is one, made before or after.
    fn channel(
        &mut self,
        system: Option<&str>,
        address: &str,
        description: &QueueDescription,
    ) -> String {
        let key = ChannelKey {
            system: system.map(str::to_string),
            binding: description
                .channel_binding
                .as_ref()
                .map(|(protocol, binding)| format!("{protocol} {binding}")),
            address: address.to_string(),
        };
        if let Some(id) = self.addresses.get(&key) {
            return id.clone();
        }
        if system.is_none() {
            // Sent through another broker's publisher: the queue of that name a mount
            // reads, whichever broker it is on (the first channel made, if several).
            let known = self.addresses.iter().filter(|(k, _)| k.address == address);
            if let Some(id) = known.map(|(_, id)| id).min() {
                return id.clone();
            }
        } else {
            // A channel made earlier for a destination of unknown broker is this queue.
            let unknown = ChannelKey {
                system: None,
                binding: None,
                address: address.to_string(),
            };
            if let Some(id) = self.addresses.remove(&unknown) {
                if let (Some((protocol, binding)), Some(Value::Object(channel))) =
                    (&description.channel_binding, self.channels.get_mut(&id))
                {
                    channel.insert("bindings".into(), json!({ *protocol: binding }));
                }
                self.addresses.insert(key, id.clone());
                return id;
            }
        }
        let id = unique(
            &self.channels.keys().cloned().collect(),
            &identifier(address),
        );
        let mut channel = Map::new();
        channel.insert("address".into(), json!(address));
        channel.insert("messages".into(), json!({}));
        if let Some((protocol, binding)) = &description.channel_binding {
            channel.insert("bindings".into(), json!({ *protocol: binding }));
        }
        self.channels.insert(id.clone(), Value::Object(channel));
        self.addresses.insert(key, id.clone());
        id
    }

    /// Adds the message a mount receives to its channel; a reference to it.
    fn received_message(&mut self, channel: &str, mount: &MountDescription<'_>) -> Value {
        let name = payload_name((mount.payload.type_name)());
        let mut message = Map::new();
        message.insert("name".into(), json!(name));
        if let Some(content_type) = mount.payload.format.and_then(|f| f.content_types.first()) {
            message.insert("contentType".into(), json!(content_type));
        }
        if let Some(payload) = self.payload_schema(mount.options) {
            message.insert("payload".into(), payload);
        }
        self.dress(&mut message, mount.received);
        self.add_message(channel, &name, message)
    }

    /// Adds the message a mount publishes to its destination's channel.
    fn sent_message(
        &mut self,
        channel: &str,
        mount: &MountDescription<'_>,
        sent: &QueueDescription,
    ) -> Value {
        let mut message = Map::new();
        let name = self.output_schema(mount.options, &mut message);
        self.dress(&mut message, sent);
        self.add_message(channel, &name, message)
    }

    /// The headers every message carries: the partition key, and the correlation id.
    fn dress(&self, message: &mut Map<String, Value>, description: &QueueDescription) {
        if let Some(header) = description.partition_key_header {
            message.insert(
                "headers".into(),
                json!({
                    "type": "object",
                    "properties": {
                        header: {
                            "type": "string",
                            "description": "The partition key: messages with one key are handled in order, one at a time, by keyed dispatch (`workers(n).by_key()`)."
                        }
                    }
                }),
            );
        }
        message.insert(
            "correlationId".into(),
            json!({ "location": format!("$message.header#/{}", crate::CORRELATION_ID_HEADER) }),
        );
    }

    fn add_message(&mut self, channel: &str, name: &str, message: Map<String, Value>) -> Value {
        let Some(Value::Object(entry)) = self.channels.get_mut(channel) else {
            return Value::Null;
        };
        let Some(Value::Object(messages)) = entry.get_mut("messages") else {
            return Value::Null;
        };
        let message = Value::Object(message);
        // The same message again (two mounts on one queue): one entry.
        let existing = messages
            .iter()
            .find(|(_, known)| **known == message)
            .map(|(id, _)| id.clone());
        let id = existing.unwrap_or_else(|| {
            let id = unique(&messages.keys().cloned().collect(), &identifier(name));
            messages.insert(id.clone(), message);
            id
        });
        reference(&["channels", channel, "messages", &id])
    }

    fn operation_id(&self, action: &str, channel: &str) -> String {
        let taken = self.operations.keys().cloned().collect();
        unique(&taken, &format!("{action}_{channel}"))
    }

    /// The payload's schema, where the mount named one (feature `schemars`).
    fn payload_schema(&mut self, options: &MountOptions) -> Option<Value> {
        #[cfg(feature = "schemars")]
        if let Some(schema) = options.payload_schema_fn() {
            let generator = self.schemas.get_or_insert_with(generator);
            return Some(object_schema(schema(generator).to_value()));
        }
        let _ = options;
        None
    }

    /// Names the mount's output message and sets its schema, where the mount named one.
    fn output_schema(
        &mut self,
        options: &MountOptions,
        message: &mut Map<String, Value>,
    ) -> String {
        #[cfg(feature = "schemars")]
        if let Some((schema, name)) = options.output_schema_fn() {
            let generator = self.schemas.get_or_insert_with(generator);
            message.insert("name".into(), json!(name()));
            message.insert(
                "payload".into(),
                object_schema(schema(generator).to_value()),
            );
            return name().into_owned();
        }
        let _ = (options, message);
        "output".to_string()
    }

    fn finish(self, title: &str, version: &str) -> Document {
        let mut document = Map::new();
        document.insert("asyncapi".into(), json!(ASYNCAPI_VERSION));
        document.insert(
            "info".into(),
            json!({
                "title": title,
                "version": version,
                "description": format!("The messages the Conveyor service `{title}` receives and sends."),
            }),
        );
        document.insert("defaultContentType".into(), json!("application/json"));
        document.insert("channels".into(), Value::Object(self.channels));
        document.insert("operations".into(), Value::Object(self.operations));
        #[cfg(feature = "schemars")]
        if let Some(mut generator) = self.schemas {
            let schemas: Map<String, Value> = generator
                .take_definitions(true)
                .into_iter()
                .map(|(name, schema)| (name, object_schema(schema)))
                .collect();
            document.insert("components".into(), json!({ "schemas": schemas }));
        }
        Document(Value::Object(document))
    }
}

/// A schema generator whose named subschemas go to the document's
/// `components.schemas`, in the JSON Schema draft AsyncAPI's schema object extends.
#[cfg(feature = "schemars")]
fn generator() -> schemars::SchemaGenerator {
    let mut settings = schemars::generate::SchemaSettings::draft07();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    schemars::SchemaGenerator::new(settings)
}

/// `schema` as an object: JSON Schema's boolean schemas (`true` for any JSON, as
/// schemars gives for `serde_json::Value`; `false` for none) become `{}` and
/// `{"not": {}}`. AsyncAPI 3.0.0 takes a message's `payload` and a `components.schemas`
/// entry as a Schema Object *or* a Multi Format Schema Object, and its official schema
/// tells them apart by requiring an object, so a boolean there is refused; nested
/// schemas (a property's) may stay boolean.
#[cfg(feature = "schemars")]
fn object_schema(schema: Value) -> Value {
    match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => json!({ "not": {} }),
        other => other,
    }
}

/// A `$ref` to the document's `path`, each part escaped as a JSON pointer's.
fn reference(path: &[&str]) -> Value {
    let mut pointer = String::from("#");
    for part in path {
        pointer.push('/');
        pointer.push_str(&part.replace('~', "~0").replace('/', "~1"));
    }
    json!({ "$ref": pointer })
}

/// `name` as an identifier of the document: letters, digits, `.`, `-` and `_` kept,
/// anything else `_`.
fn identifier(name: &str) -> String {
    let id: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if id.is_empty() { "_".to_string() } else { id }
}

/// `wanted`, or `wanted_2`, `wanted_3`, ... whichever is not yet `taken`.
fn unique(taken: &HashSet<String>, wanted: &str) -> String {
    if !taken.contains(wanted) {
        return wanted.to_string();
    }
    (2u32..)
        .map(|n| format!("{wanted}_{n}"))
        .find(|id| !taken.contains(id))
        .unwrap_or_else(|| wanted.to_string())
}

/// A message's name from its payload type's: the innermost type, without its path
/// (`Batch<Json<shop::Order>>` is `Order`).
fn payload_name(type_name: &str) -> String {
    let mut inner = type_name;
    while let (Some(open), true) = (inner.find('<'), inner.ends_with('>')) {
        let wrapper = inner[..open].rsplit("::").next().unwrap_or_default();
        if !matches!(wrapper, "Json" | "MsgPack" | "Cbor" | "Batch") {
            break;
        }
        inner = &inner[open + 1..inner.len() - 1];
    }
    let base = inner.split('<').next().unwrap_or(inner);
    let short = base.rsplit("::").next().unwrap_or(base);
    let generics = &inner[base.len()..];
    format!("{short}{generics}")
}

fn dispatch(options: &MountOptions, batch: bool) -> Value {
    if batch || options.batch_size().is_some() {
        let size = options.batch_size().unwrap_or(crate::DEFAULT_BATCH_SIZE);
        return json!({ "mode": "batch", "size": size });
    }
    match options.dispatch() {
        Dispatch::Sequential => json!({ "mode": "sequential" }),
        Dispatch::Workers(n) => json!({ "mode": "workers", "workers": n }),
        Dispatch::Lanes(n) => json!({
            "mode": "lanes",
            "lanes": n,
            "orderedBy": "partition key",
        }),
        Dispatch::AnyWorker {
            workers,
            read_ahead,
        } => json!({
            "mode": "any_worker",
            "workers": workers,
            "readAhead": read_ahead,
            "orderedBy": "partition key",
        }),
    }
}

fn failure_policy(policy: &FailurePolicy) -> Value {
    let mut described = Map::new();
    let on_error = match policy.on_error {
        OnError::Retry => json!("retry"),
        OnError::RetryAfter(backoff) => {
            let (base, max, exponential) = backoff.parts();
            described.insert(
                "backoff".into(),
                json!({
                    "kind": if exponential { "exponential" } else { "fixed" },
                    "baseMs": millis(base),
                    "maxMs": millis(max),
                }),
            );
            json!("retry_after")
        }
        OnError::Reject => json!("reject"),
    };
    described.insert("onError".into(), on_error);
    described.insert("maxAttempts".into(), json!(policy.max_attempts));
    Value::Object(described)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_named_after_its_innermost_payload_type() {
        assert_eq!(
            payload_name("conveyor::payload::Json<shop::Order>"),
            "Order"
        );
        assert_eq!(
            payload_name("conveyor::batch::Batch<conveyor::payload::Json<shop::Order>>"),
            "Order"
        );
        assert_eq!(payload_name("bytes::bytes::Bytes"), "Bytes");
        assert_eq!(
            payload_name("conveyor::payload::Json<alloc::vec::Vec<u64>>"),
            "Vec<u64>"
        );
    }

    #[test]
    fn identifiers_keep_what_asyncapi_allows_and_never_repeat() {
        assert_eq!(identifier("orders.fifo"), "orders.fifo");
        assert_eq!(identifier("amq.gen/x y"), "amq.gen_x_y");
        let taken: HashSet<String> = ["a".to_string(), "a_2".to_string()].into();
        assert_eq!(unique(&taken, "a"), "a_3");
        assert_eq!(unique(&taken, "b"), "b");
        assert_eq!(
            reference(&["channels", "a/b~c"]),
            json!({ "$ref": "#/channels/a~1b~0c" })
        );
    }
}
