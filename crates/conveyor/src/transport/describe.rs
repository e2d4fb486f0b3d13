//! How a transport describes a queue for the app's AsyncAPI document: plain data, so the
//! contract knows nothing of the document that uses it.

use serde_json::Value;

/// How a transport describes one of its queues in an AsyncAPI document
/// ([`Source::describe`](crate::Source::describe)).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct QueueDescription {
    /// The header (or attribute) the transport carries the partition key in.
    pub partition_key_header: Option<&'static str>,
    /// The channel's bindings: the protocol's name (`amqp`, `sqs`) and its binding
    /// object.
    pub channel_binding: Option<(&'static str, Value)>,
    /// The binding of an operation that receives from the channel.
    pub receive_binding: Option<(&'static str, Value)>,
    /// The binding of an operation that sends to the channel.
    pub send_binding: Option<(&'static str, Value)>,
}

impl QueueDescription {
    /// A description with the partition key's header and nothing else.
    pub fn new(partition_key_header: Option<&'static str>) -> Self {
        QueueDescription {
            partition_key_header,
            ..QueueDescription::default()
        }
    }

    /// With the channel binding `binding` of `protocol`.
    pub fn channel_binding(mut self, protocol: &'static str, binding: Value) -> Self {
        self.channel_binding = Some((protocol, binding));
        self
    }

    /// With the binding `binding` of `protocol` for operations that receive.
    pub fn receive_binding(mut self, protocol: &'static str, binding: Value) -> Self {
        self.receive_binding = Some((protocol, binding));
        self
    }

    /// With the binding `binding` of `protocol` for operations that send.
    pub fn send_binding(mut self, protocol: &'static str, binding: Value) -> Self {
        self.send_binding = Some((protocol, binding));
        self
    }
}
