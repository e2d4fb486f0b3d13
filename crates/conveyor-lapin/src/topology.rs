//! Queues, exchanges and bindings: what the transport declares (or, in passive mode,
//! only checks) before it consumes or publishes.
//!
//! A declaration is made on the channel that needs it, so when the connection is lost
//! and recovered the client replays it on the new connection before the consumer
//! resumes.

use lapin::Channel;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};

use crate::error::{LapinError, is_not_found, short};

/// A queue or exchange argument value (`x-max-priority = 10`, `x-queue-type = "quorum"`,
/// `x-single-active-consumer = true`).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ArgumentValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(String),
}

impl From<bool> for ArgumentValue {
    fn from(v: bool) -> Self {
        ArgumentValue::Bool(v)
    }
}
impl From<i64> for ArgumentValue {
    fn from(v: i64) -> Self {
        ArgumentValue::Int(v)
    }
}
impl From<i32> for ArgumentValue {
    fn from(v: i32) -> Self {
        ArgumentValue::Int(v.into())
    }
}
impl From<u32> for ArgumentValue {
    fn from(v: u32) -> Self {
        ArgumentValue::Int(v.into())
    }
}
impl From<u8> for ArgumentValue {
    fn from(v: u8) -> Self {
        ArgumentValue::Int(v.into())
    }
}
impl From<&str> for ArgumentValue {
    fn from(v: &str) -> Self {
        ArgumentValue::Str(v.to_string())
    }
}
impl From<String> for ArgumentValue {
    fn from(v: String) -> Self {
        ArgumentValue::Str(v)
    }
}

impl ArgumentValue {
    fn to_amqp(&self) -> AMQPValue {
        match self {
            ArgumentValue::Bool(b) => AMQPValue::Boolean(*b),
            ArgumentValue::Int(i) => AMQPValue::LongLongInt(*i),
            ArgumentValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_bytes())),
        }
    }
}

/// Named arguments, converted to an AMQP table when declared.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Arguments(Vec<(String, ArgumentValue)>);

impl Arguments {
    pub(crate) fn set(&mut self, name: String, value: ArgumentValue) {
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, value));
    }

    pub(crate) fn get(&self, name: &str) -> Option<&ArgumentValue> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    pub(crate) fn table(&self) -> Result<FieldTable, LapinError> {
        let mut table = FieldTable::default();
        for (name, value) in &self.0 {
            table.insert(short("argument name", name)?, value.to_amqp());
        }
        Ok(table)
    }
}

/// How a queue is declared: durable by default, with any arguments; or passive, to only
/// check that a queue owned elsewhere exists.
///
/// ```
/// use conveyor_lapin::QueueSpec;
///
/// let orders = QueueSpec::new("orders")
///     .quorum()
///     .single_active_consumer()
///     .dead_letter_exchange("orders.dlx")
///     .argument("x-max-length", 100_000);
/// assert_eq!(orders.name(), "orders");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSpec {
    name: String,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    passive: bool,
    arguments: Arguments,
}

impl QueueSpec {
    /// A durable, shared queue named `name`, with no arguments.
    pub fn new(name: impl Into<String>) -> Self {
        QueueSpec {
            name: name.into(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            passive: false,
            arguments: Arguments::default(),
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the queue survives a broker restart (default `true`).
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Makes the queue private to this connection, deleted when it closes.
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }

    /// Deletes the queue once its last consumer has gone.
    pub fn auto_delete(mut self) -> Self {
        self.auto_delete = true;
        self
    }

    /// Declares nothing: only checks that the queue exists (topology owned elsewhere). A
    /// missing queue fails the subscription with an error naming it.
    pub fn passive(mut self) -> Self {
        self.passive = true;
        self
    }

    /// Whether the queue survives a broker restart.
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// Whether the queue is private to its connection.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    /// Whether the queue is only checked, not declared.
    pub fn is_passive(&self) -> bool {
        self.passive
    }

    /// Sets any queue argument (`x-max-priority`, `x-message-ttl`, `x-expires`, ...).
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<ArgumentValue>) -> Self {
        self.arguments.set(name.into(), value.into());
        self
    }

    /// `x-queue-type = quorum`: a replicated queue that counts deliveries
    /// (`x-delivery-count`, exposed as the delivery's receive count).
    pub fn quorum(self) -> Self {
        self.argument("x-queue-type", "quorum")
    }

    /// `x-single-active-consumer = true`: one consumer reads the queue at a time; another
    /// takes over when it stops.
    pub fn single_active_consumer(self) -> Self {
        self.argument("x-single-active-consumer", true)
    }

    /// `x-dead-letter-exchange`: where rejected (and expired) messages go. A subscription
    /// that knows it from here sends rejected messages there itself, with the reason in
    /// [`conveyor::REJECT_REASON_HEADER`].
    pub fn dead_letter_exchange(self, exchange: impl Into<String>) -> Self {
        self.argument("x-dead-letter-exchange", exchange.into())
    }

    /// `x-dead-letter-routing-key`: the routing key dead-lettered messages get.
    pub fn dead_letter_routing_key(self, key: impl Into<String>) -> Self {
        self.argument("x-dead-letter-routing-key", key.into())
    }

    /// `x-max-priority`: enables message priorities up to `max`.
    pub fn max_priority(self, max: u8) -> Self {
        self.argument("x-max-priority", max)
    }

    /// Where the broker dead-letters this queue's messages, as its declaration says: the
    /// `x-dead-letter-exchange` argument and the `x-dead-letter-routing-key` (else the
    /// queue's own name). `None` for a passive queue, or one without that argument, whose
    /// dead-lettering (if any) comes from a policy this crate cannot see.
    pub(crate) fn dead_letter_target(&self) -> Option<(&str, &str)> {
        if self.passive {
            return None;
        }
        let ArgumentValue::Str(exchange) = self.arguments.get("x-dead-letter-exchange")? else {
            return None;
        };
        let routing_key = match self.arguments.get("x-dead-letter-routing-key") {
            Some(ArgumentValue::Str(key)) => key.as_str(),
            _ => self.name.as_str(),
        };
        Some((exchange.as_str(), routing_key))
    }

    /// Declares the queue on `channel` (or checks it, in passive mode), and returns how
    /// many messages are ready in it.
    pub(crate) async fn declare(&self, channel: &Channel) -> Result<u32, LapinError> {
        let options = QueueDeclareOptions {
            passive: self.passive,
            durable: self.durable,
            exclusive: self.exclusive,
            auto_delete: self.auto_delete,
            nowait: false,
        };
        let arguments = if self.passive {
            FieldTable::default()
        } else {
            self.arguments.table()?
        };
        match channel
            .queue_declare(short("queue name", &self.name)?, options, arguments)
            .await
        {
            Ok(queue) => Ok(queue.message_count()),
            Err(e) if self.passive && is_not_found(&e) => Err(LapinError::MissingQueue {
                queue: self.name.clone(),
            }),
            Err(source) => Err(LapinError::Declare {
                what: "queue",
                name: self.name.clone(),
                source,
            }),
        }
    }
}

/// The type of an exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExchangeType {
    /// Routes on an exact routing key.
    Direct,
    /// Routes on routing-key patterns (`orders.*.eu`).
    Topic,
    /// Routes to every bound queue.
    Fanout,
    /// Routes on header values.
    Headers,
    /// `x-consistent-hash` (plugin `rabbitmq_consistent_hash_exchange`): spreads routing
    /// keys, or a header named by the `hash-header` argument, over the bound queues.
    ConsistentHash,
    /// Any other plugin type, by name.
    Custom(String),
}

impl ExchangeType {
    fn kind(&self) -> lapin::ExchangeKind {
        match self {
            ExchangeType::Direct => lapin::ExchangeKind::Direct,
            ExchangeType::Topic => lapin::ExchangeKind::Topic,
            ExchangeType::Fanout => lapin::ExchangeKind::Fanout,
            ExchangeType::Headers => lapin::ExchangeKind::Headers,
            ExchangeType::ConsistentHash => {
                lapin::ExchangeKind::Custom("x-consistent-hash".to_string())
            }
            ExchangeType::Custom(name) => lapin::ExchangeKind::Custom(name.clone()),
        }
    }
}

/// How an exchange is declared: durable by default, with any arguments; or passive.
///
/// ```
/// use conveyor_lapin::{ExchangeSpec, ExchangeType};
///
/// let spread = ExchangeSpec::new("orders.hash", ExchangeType::ConsistentHash)
///     .argument("hash-header", "amqp-partition-key");
/// assert_eq!(spread.name(), "orders.hash");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeSpec {
    name: String,
    kind: ExchangeType,
    durable: bool,
    auto_delete: bool,
    internal: bool,
    passive: bool,
    arguments: Arguments,
}

impl ExchangeSpec {
    /// A durable exchange of type `kind` named `name`.
    pub fn new(name: impl Into<String>, kind: ExchangeType) -> Self {
        ExchangeSpec {
            name: name.into(),
            kind,
            durable: true,
            auto_delete: false,
            internal: false,
            passive: false,
            arguments: Arguments::default(),
        }
    }

    /// The exchange's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the exchange survives a broker restart (default `true`).
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Deletes the exchange once its last binding has gone.
    pub fn auto_delete(mut self) -> Self {
        self.auto_delete = true;
        self
    }

    /// Makes the exchange reachable only from other exchanges.
    pub fn internal(mut self) -> Self {
        self.internal = true;
        self
    }

    /// Declares nothing: only checks that the exchange exists.
    pub fn passive(mut self) -> Self {
        self.passive = true;
        self
    }

    /// Sets any exchange argument (`hash-header`, `alternate-exchange`, ...).
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<ArgumentValue>) -> Self {
        self.arguments.set(name.into(), value.into());
        self
    }

    pub(crate) async fn declare(&self, channel: &Channel) -> Result<(), LapinError> {
        let options = ExchangeDeclareOptions {
            passive: self.passive,
            durable: self.durable,
            auto_delete: self.auto_delete,
            internal: self.internal,
            nowait: false,
        };
        let arguments = if self.passive {
            FieldTable::default()
        } else {
            self.arguments.table()?
        };
        match channel
            .exchange_declare(
                short("exchange name", &self.name)?,
                self.kind.kind(),
                options,
                arguments,
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if self.passive && is_not_found(&e) => Err(LapinError::MissingExchange {
                exchange: self.name.clone(),
            }),
            Err(source) => Err(LapinError::Declare {
                what: "exchange",
                name: self.name.clone(),
                source,
            }),
        }
    }
}

/// A binding of a queue to an exchange with a routing key (for a consistent-hash
/// exchange, the routing key is the queue's weight, such as `"1"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    queue: String,
    exchange: String,
    routing_key: String,
    arguments: Arguments,
}

impl Binding {
    /// Binds `queue` to `exchange` under `routing_key`.
    pub fn new(
        queue: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        Binding {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            arguments: Arguments::default(),
        }
    }

    /// Sets a binding argument (for a headers exchange: `x-match` and the header values).
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<ArgumentValue>) -> Self {
        self.arguments.set(name.into(), value.into());
        self
    }

    pub(crate) async fn declare(&self, channel: &Channel) -> Result<(), LapinError> {
        channel
            .queue_bind(
                short("queue name", &self.queue)?,
                short("exchange name", &self.exchange)?,
                short("routing key", &self.routing_key)?,
                QueueBindOptions::default(),
                self.arguments.table()?,
            )
            .await
            .map_err(|source| LapinError::Declare {
                what: "binding",
                name: format!("{} -> {} ({})", self.exchange, self.queue, self.routing_key),
                source,
            })
    }
}

impl From<&str> for QueueSpec {
    fn from(name: &str) -> Self {
        QueueSpec::new(name)
    }
}

impl From<String> for QueueSpec {
    fn from(name: String) -> Self {
        QueueSpec::new(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dead_letter_target_comes_from_the_declaration() {
        assert_eq!(QueueSpec::new("q").dead_letter_target(), None);
        assert_eq!(
            QueueSpec::new("q")
                .dead_letter_exchange("dlx")
                .dead_letter_target(),
            Some(("dlx", "q"))
        );
        assert_eq!(
            QueueSpec::new("q")
                .dead_letter_exchange("")
                .dead_letter_routing_key("q.dead")
                .dead_letter_target(),
            Some(("", "q.dead"))
        );
        assert_eq!(
            QueueSpec::new("q")
                .dead_letter_exchange("dlx")
                .passive()
                .dead_letter_target(),
            None
        );
    }
}
