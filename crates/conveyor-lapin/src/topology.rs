//! Exchanges, bindings and the arguments they (and queues) are declared with: the
//! RabbitMQ topology beyond the portable [`conveyor::QueueSpec`].
//!
//! A declaration is made on a channel that stays open, so when the connection is lost
//! and recovered the client replays it on the new connection; when the broker closes
//! that channel over a declaration it refused, the next one is given the declarations
//! made before ([`crate::redeclare`]).

use lapin::Channel;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
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

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &ArgumentValue)> {
        self.0.iter().map(|(name, value)| (name.as_str(), value))
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

    pub(crate) fn is_passive(&self) -> bool {
        self.passive
    }

    pub(crate) fn is_auto_delete(&self) -> bool {
        self.auto_delete
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

    pub(crate) fn queue(&self) -> &str {
        &self.queue
    }

    pub(crate) fn exchange(&self) -> &str {
        &self.exchange
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
