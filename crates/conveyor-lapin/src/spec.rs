//! RabbitMQ's reading of the portable [`QueueSpec`]: what each portable setting becomes in
//! a queue declaration, and the RabbitMQ settings ([`RabbitQueueSpec`]) a spec can carry
//! on top.

use conveyor::QueueSpec;
use lapin::Channel;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::error::{LapinError, is_not_found, short};
use crate::topology::{ArgumentValue, Arguments};

/// The delay queue of `<queue>` is `<queue>.delay` unless named otherwise.
pub(crate) const DELAY_QUEUE_SUFFIX: &str = ".delay";

/// The default delay queue of a quorum queue `<queue>` is `<queue>.delay.quorum`: a name
/// of its own, because a classic `<queue>.delay` made by an earlier version may exist,
/// and RabbitMQ refuses to declare a queue again with another `x-queue-type`.
pub(crate) const QUORUM_DELAY_QUEUE_SUFFIX: &str = ".delay.quorum";

/// The name of the default delay queue of `queue` when it is not a quorum queue (or its
/// type is unknown).
pub(crate) fn delay_queue_of(queue: &str) -> String {
    format!("{queue}{DELAY_QUEUE_SUFFIX}")
}

/// The name of the default delay queue of `queue`, given its declaration where this
/// broker made it: `<queue>.delay.quorum` for a quorum queue, else `<queue>.delay`.
pub(crate) fn default_delay_queue(queue: &str, known: Option<&Declaration>) -> String {
    if known.is_some_and(Declaration::is_quorum) {
        format!("{queue}{QUORUM_DELAY_QUEUE_SUFFIX}")
    } else {
        delay_queue_of(queue)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for conveyor::QueueSpec {}
}

/// RabbitMQ settings on the portable [`QueueSpec`]: queue type, arguments, durability.
///
/// Import the trait to call these on a spec; they are kept in the spec as one extension,
/// which other transports ignore, so a spec dressed for RabbitMQ still declares the same
/// queue elsewhere. [`LapinBroker::declare_queue`](crate::LapinBroker::declare_queue)
/// reads the portable settings this way:
///
/// | portable setting | RabbitMQ declaration |
/// | --- | --- |
/// | a name ending in `.fifo` | `x-single-active-consumer = true`: one consumer at a time reads the queue, the only way RabbitMQ keeps its order across competing consumers; another takes over when it stops |
/// | [`dead_letter_queue(q, n)`](QueueSpec::dead_letter_queue) | `x-dead-letter-exchange = ""` and `x-dead-letter-routing-key = q` (the dead-letter queue must exist: it is checked); on a quorum queue also `x-delivery-limit = n`. A classic queue cannot count receives, so there `n` is not enforced by the broker: the mount's `max_attempts` counts attempts on every queue type |
/// | [`visibility_timeout(d)`](QueueSpec::visibility_timeout) | `x-consumer-timeout` in milliseconds: how long a consumer may hold a delivery unacked. Honoured by RabbitMQ 3.12 and later (and 3.11.15 on), which then closes the consumer's channel: its unacked deliveries go back to the queue, and the subscription cannot go on (the app stops with an error). Nothing renews the hold, as the SQS extender does, so make it longer than a handler, with its retries in place, can keep a delivery. Older brokers accept the argument and ignore it |
/// | [`delay(d)`](QueueSpec::delay) | refused with [`conveyor::Error::Config`]: RabbitMQ has no queue-level delivery delay (a handler's retry-after waits in the queue's delay queue instead) |
///
/// An [`argument`](Self::argument) set here wins over one the portable settings map to.
///
/// ```
/// use conveyor::QueueSpec;
/// use conveyor_lapin::RabbitQueueSpec;
///
/// let orders = QueueSpec::new("orders")
///     .dead_letter_queue("orders.dead", 5)
///     .quorum()
///     .argument("x-max-length", 100_000);
/// assert_eq!(orders.name(), "orders");
/// ```
pub trait RabbitQueueSpec: sealed::Sealed + Sized {
    /// `x-queue-type = quorum`: a replicated queue that counts deliveries
    /// (`x-delivery-count`, part of the delivery's receive count), and enforces the max
    /// receive count of a [dead-letter queue](QueueSpec::dead_letter_queue) as its
    /// `x-delivery-limit`. Durable, never exclusive nor auto-delete.
    fn quorum(self) -> Self;

    /// `x-single-active-consumer = true`: one consumer reads the queue at a time; another
    /// takes over when it stops. (A `.fifo` name sets it too.)
    fn single_active_consumer(self) -> Self;

    /// `x-max-priority`: enables message priorities up to `max` (classic queues).
    fn max_priority(self, max: u8) -> Self;

    /// Sets any queue argument (`x-max-length`, `x-message-ttl`, `x-expires`, ...),
    /// replacing one of the same name, including one a portable setting maps to.
    fn argument(self, name: impl Into<String>, value: impl Into<ArgumentValue>) -> Self;

    /// Whether the queue survives a broker restart (default `true`).
    fn durable(self, durable: bool) -> Self;

    /// Makes the queue private to the broker's connection and deleted when it closes.
    /// (After a lost connection, a subscription declares it again, empty.)
    fn exclusive(self) -> Self;

    /// Deletes the queue once its last consumer has gone.
    fn auto_delete(self) -> Self;

    /// `x-dead-letter-exchange`: rejected (and expired) messages go to this exchange, for
    /// dead-lettering beyond one queue (a fanout to several, say). Excludes a portable
    /// [`dead_letter_queue`](QueueSpec::dead_letter_queue), which is the default exchange
    /// and a routing key.
    fn dead_letter_exchange(self, exchange: impl Into<String>) -> Self;

    /// `x-dead-letter-routing-key`: the routing key dead-lettered messages get (else
    /// their own).
    fn dead_letter_routing_key(self, key: impl Into<String>) -> Self;
}

/// The RabbitMQ settings of a spec, kept in it as one extension.
#[derive(Clone, Debug, PartialEq)]
struct RabbitOptions {
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: Arguments,
    dead_letter_exchange: Option<String>,
    dead_letter_routing_key: Option<String>,
}

impl Default for RabbitOptions {
    fn default() -> Self {
        RabbitOptions {
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments: Arguments::default(),
            dead_letter_exchange: None,
            dead_letter_routing_key: None,
        }
    }
}

/// `spec` with its RabbitMQ settings changed by `change`.
fn update(spec: QueueSpec, change: impl FnOnce(&mut RabbitOptions)) -> QueueSpec {
    let mut options = spec
        .extension::<RabbitOptions>()
        .cloned()
        .unwrap_or_default();
    change(&mut options);
    spec.with_extension(options)
}

impl RabbitQueueSpec for QueueSpec {
    fn quorum(self) -> Self {
        self.argument("x-queue-type", "quorum")
    }

    fn single_active_consumer(self) -> Self {
        self.argument("x-single-active-consumer", true)
    }

    fn max_priority(self, max: u8) -> Self {
        self.argument("x-max-priority", max)
    }

    fn argument(self, name: impl Into<String>, value: impl Into<ArgumentValue>) -> Self {
        let (name, value) = (name.into(), value.into());
        update(self, |options| options.arguments.set(name, value))
    }

    fn durable(self, durable: bool) -> Self {
        update(self, |options| options.durable = durable)
    }

    fn exclusive(self) -> Self {
        update(self, |options| options.exclusive = true)
    }

    fn auto_delete(self) -> Self {
        update(self, |options| options.auto_delete = true)
    }

    fn dead_letter_exchange(self, exchange: impl Into<String>) -> Self {
        let exchange = exchange.into();
        update(self, |options| {
            options.dead_letter_exchange = Some(exchange)
        })
    }

    fn dead_letter_routing_key(self, key: impl Into<String>) -> Self {
        let key = key.into();
        update(self, |options| options.dead_letter_routing_key = Some(key))
    }
}

/// A queue declaration as RabbitMQ takes it: flags and an argument table.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Declaration {
    name: String,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: Arguments,
}

impl Declaration {
    /// The queue's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether the broker deletes the queue once its last consumer has gone.
    pub(crate) fn is_auto_delete(&self) -> bool {
        self.auto_delete
    }

    /// Whether it is a quorum queue (`x-queue-type = quorum`).
    pub(crate) fn is_quorum(&self) -> bool {
        matches!(
            self.arguments.get("x-queue-type"),
            Some(ArgumentValue::Str(kind)) if kind == "quorum"
        )
    }

    /// A durable, shared queue with no arguments: what a subscription declares for a
    /// queue that does not exist yet.
    pub(crate) fn plain(name: &str) -> Self {
        Declaration {
            name: name.to_string(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments: Arguments::default(),
        }
    }

    /// The declaration of `spec`, or a [`conveyor::Error::Config`] saying which of its
    /// settings RabbitMQ cannot take.
    pub(crate) fn from_spec(spec: &QueueSpec) -> Result<Self, conveyor::Error> {
        let name = spec.name();
        if name.is_empty() {
            // An empty name asks the broker to make one up, which nobody could then use.
            return Err(conveyor::Error::config(
                "a RabbitMQ queue needs a name (the spec's is empty)",
            ));
        }
        short("queue name", name).map_err(conveyor::Error::from)?;
        let invalid = |what: &str| conveyor::Error::config(format!("queue `{name}`: {what}"));
        if spec.delivery_delay().is_some() {
            return Err(invalid(&format!(
                "RabbitMQ has no queue-level delivery delay; declare it without `delay(..)` \
                 (a handler's retry-after waits in its delay queue `{}` instead)",
                delay_queue_of(name)
            )));
        }
        let options = spec
            .extension::<RabbitOptions>()
            .cloned()
            .unwrap_or_default();
        let quorum = matches!(
            options.arguments.get("x-queue-type"),
            Some(ArgumentValue::Str(kind)) if kind == "quorum"
        );

        let mut arguments = Arguments::default();
        if spec.is_fifo() {
            arguments.set("x-single-active-consumer".into(), true.into());
        }
        if let Some(policy) = spec.dead_letter() {
            if options.dead_letter_exchange.is_some() || options.dead_letter_routing_key.is_some() {
                return Err(invalid(
                    "it names both a dead-letter queue and a dead-letter exchange or routing key; keep one",
                ));
            }
            if policy.max_receive_count == 0 {
                return Err(invalid(
                    "the max receive count of its dead-letter queue must be at least 1",
                ));
            }
            short("dead-letter queue name", &policy.queue).map_err(conveyor::Error::from)?;
            // The default exchange routes a message to the queue its routing key names.
            arguments.set("x-dead-letter-exchange".into(), "".into());
            arguments.set(
                "x-dead-letter-routing-key".into(),
                policy.queue.as_str().into(),
            );
            if quorum {
                arguments.set("x-delivery-limit".into(), policy.max_receive_count.into());
            }
        }
        if let Some(exchange) = &options.dead_letter_exchange {
            arguments.set("x-dead-letter-exchange".into(), exchange.as_str().into());
        }
        if let Some(key) = &options.dead_letter_routing_key {
            arguments.set("x-dead-letter-routing-key".into(), key.as_str().into());
        }
        if let Some(timeout) = spec.visibility() {
            // Rounded up, so that a hold is never shorter than asked.
            let millis = timeout.as_nanos().div_ceil(1_000_000);
            let millis = i64::try_from(millis)
                .ok()
                .filter(|ms| *ms > 0)
                .ok_or_else(|| {
                    invalid(&format!(
                        "a visibility timeout of {timeout:?} is out of range (1 ms and up)"
                    ))
                })?;
            arguments.set("x-consumer-timeout".into(), millis.into());
        }
        for (argument, value) in options.arguments.iter() {
            arguments.set(argument.to_string(), value.clone());
        }
        // Checked here, so that a bad name is a configuration error rather than a
        // broker failure.
        arguments.table().map_err(conveyor::Error::from)?;
        Ok(Declaration {
            name: name.to_string(),
            durable: options.durable,
            exclusive: options.exclusive,
            auto_delete: options.auto_delete,
            arguments,
        })
    }

    /// The delay queue `name` of the queue `queue`: expired messages (per-message TTL)
    /// go back to `queue` through the default exchange. It lives as long as `queue` does
    /// when `queue`'s declaration is known: durable with a durable queue, gone with the
    /// connection with an exclusive one; durable otherwise.
    ///
    /// The delay queue of a quorum queue is a quorum queue too, so that it outlives a
    /// node as its queue does (a classic queue lives on one node: were that node lost,
    /// the subscription could not declare it again and would not resume). It
    /// dead-letters at least once (`x-dead-letter-strategy`, RabbitMQ 3.10 and later,
    /// which asks for `x-overflow = reject-publish`): an expired message stays in the
    /// delay queue until `queue` has taken it, where the default at-most-once would drop
    /// it if `queue` had no leader at that moment (during a failover).
    pub(crate) fn delay_queue(name: &str, queue: &str, of: Option<&Declaration>) -> Self {
        if of.is_some_and(Declaration::is_quorum) {
            let mut delay = Self::classic_delay_queue(name, queue, None);
            delay.arguments.set("x-queue-type".into(), "quorum".into());
            delay
                .arguments
                .set("x-dead-letter-strategy".into(), "at-least-once".into());
            delay
                .arguments
                .set("x-overflow".into(), "reject-publish".into());
            return delay;
        }
        Self::classic_delay_queue(name, queue, of)
    }

    /// The delay queue `name` of the queue `queue` as a classic queue, which is what
    /// [`delay_queue`](Self::delay_queue) makes for any queue but a quorum one: as
    /// durable as its queue, or durable when that is unknown.
    pub(crate) fn classic_delay_queue(name: &str, queue: &str, of: Option<&Declaration>) -> Self {
        let (durable, exclusive) = match of {
            Some(of) => (of.durable && !of.exclusive, of.exclusive),
            None => (true, false),
        };
        let mut arguments = Arguments::default();
        arguments.set("x-dead-letter-exchange".into(), "".into());
        arguments.set("x-dead-letter-routing-key".into(), queue.into());
        Declaration {
            name: name.to_string(),
            durable,
            exclusive,
            auto_delete: false,
            arguments,
        }
    }

    /// Whether the broker deletes the queue without being asked: with its connection
    /// (exclusive), its last consumer (auto-delete) or a restart (transient). A
    /// subscription to such a queue declares it on its own channel, so that recovering
    /// the channel declares it again before consuming.
    pub(crate) fn vanishes(&self) -> bool {
        self.exclusive || self.auto_delete || !self.durable
    }

    /// Where the broker dead-letters this queue's messages, as its declaration says: the
    /// `x-dead-letter-exchange` argument and the `x-dead-letter-routing-key` (else the
    /// queue's own name). `None` without that argument: dead-lettering, if any, then
    /// comes from a policy this crate cannot see.
    /// The consumer timeout the declaration sets (`x-consumer-timeout`), if any.
    pub(crate) fn consumer_timeout(&self) -> Option<std::time::Duration> {
        match self.arguments.get("x-consumer-timeout")? {
            ArgumentValue::Int(millis) => u64::try_from(*millis)
                .ok()
                .map(std::time::Duration::from_millis),
            _ => None,
        }
    }

    pub(crate) fn dead_letter_target(&self) -> Option<(&str, &str)> {
        let ArgumentValue::Str(exchange) = self.arguments.get("x-dead-letter-exchange")? else {
            return None;
        };
        let routing_key = match self.arguments.get("x-dead-letter-routing-key") {
            Some(ArgumentValue::Str(key)) => key.as_str(),
            _ => self.name.as_str(),
        };
        Some((exchange.as_str(), routing_key))
    }

    /// Declares the queue on `channel`. A declaration the queue's existing one
    /// contradicts fails with the broker's PRECONDITION_FAILED (and closes the channel).
    pub(crate) async fn declare(&self, channel: &Channel) -> Result<(), LapinError> {
        let options = QueueDeclareOptions {
            passive: false,
            durable: self.durable,
            exclusive: self.exclusive,
            auto_delete: self.auto_delete,
            nowait: false,
        };
        channel
            .queue_declare(
                short("queue name", &self.name)?,
                options,
                self.arguments.table()?,
            )
            .await
            .map(drop)
            .map_err(|source| LapinError::Declare {
                what: "queue",
                name: self.name.clone(),
                source,
            })
    }
}

/// Checks that the queue `name` exists (a passive declare, which leaves its settings
/// alone) and returns how many messages are ready in it. A missing queue is
/// [`LapinError::MissingQueue`], and closes the channel.
pub(crate) async fn check(channel: &Channel, name: &str) -> Result<u32, LapinError> {
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(short("queue name", name)?, options, FieldTable::default())
        .await
    {
        Ok(queue) => Ok(queue.message_count()),
        Err(e) if is_not_found(&e) => Err(LapinError::MissingQueue {
            queue: name.to_string(),
        }),
        Err(source) => Err(LapinError::Declare {
            what: "queue",
            name: name.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn argument(declaration: &Declaration, name: &str) -> Option<ArgumentValue> {
        declaration.arguments.get(name).cloned()
    }

    fn declared(spec: QueueSpec) -> Declaration {
        Declaration::from_spec(&spec).unwrap()
    }

    fn refused(spec: QueueSpec) -> String {
        match Declaration::from_spec(&spec) {
            Err(conveyor::Error::Config(text)) => text,
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn a_bare_spec_is_a_durable_queue_without_arguments() {
        assert_eq!(declared(QueueSpec::new("q")), Declaration::plain("q"));
    }

    #[test]
    fn a_dead_letter_queue_goes_through_the_default_exchange() {
        let declaration = declared(QueueSpec::new("q").dead_letter_queue("q.dead", 5));
        assert_eq!(
            argument(&declaration, "x-dead-letter-exchange"),
            Some("".into())
        );
        assert_eq!(
            argument(&declaration, "x-dead-letter-routing-key"),
            Some("q.dead".into())
        );
        assert_eq!(declaration.dead_letter_target(), Some(("", "q.dead")));
        assert_eq!(
            argument(&declaration, "x-delivery-limit"),
            None,
            "a classic queue cannot count receives"
        );
    }

    #[test]
    fn a_quorum_queue_enforces_the_max_receive_count_as_its_delivery_limit() {
        let declaration = declared(QueueSpec::new("q").dead_letter_queue("q.dead", 5).quorum());
        assert_eq!(
            argument(&declaration, "x-delivery-limit"),
            Some(5u32.into())
        );
        assert_eq!(
            argument(&declaration, "x-queue-type"),
            Some("quorum".into())
        );
    }

    #[test]
    fn the_visibility_timeout_is_the_consumer_timeout_in_whole_milliseconds() {
        let declaration =
            declared(QueueSpec::new("q").visibility_timeout(Duration::from_micros(1500)));
        assert_eq!(
            argument(&declaration, "x-consumer-timeout"),
            Some(ArgumentValue::Int(2))
        );
        let text = refused(QueueSpec::new("q").visibility_timeout(Duration::ZERO));
        assert!(text.contains("visibility timeout"), "{text}");
    }

    #[test]
    fn the_consumer_timeout_bounds_what_a_subscription_can_hold() {
        let declaration = declared(QueueSpec::new("q").visibility_timeout(Duration::from_secs(90)));
        assert_eq!(
            declaration.consumer_timeout(),
            Some(Duration::from_secs(90))
        );
        assert_eq!(declared(QueueSpec::new("q")).consumer_timeout(), None);
    }

    #[test]
    fn a_fifo_name_makes_a_single_active_consumer_queue() {
        let declaration = declared(QueueSpec::new("orders.fifo"));
        assert_eq!(
            argument(&declaration, "x-single-active-consumer"),
            Some(true.into())
        );
        assert_eq!(
            argument(
                &declared(QueueSpec::new("orders")),
                "x-single-active-consumer"
            ),
            None
        );
    }

    #[test]
    fn a_queue_level_delay_is_refused_with_the_reason() {
        let text = refused(QueueSpec::new("q").delay(Duration::from_secs(5)));
        assert!(text.contains("no queue-level delivery delay"), "{text}");
        assert!(text.contains("q.delay"), "{text}");
    }

    #[test]
    fn a_dead_letter_queue_and_a_dead_letter_exchange_exclude_each_other() {
        let text = refused(
            QueueSpec::new("q")
                .dead_letter_queue("q.dead", 5)
                .dead_letter_exchange("dlx"),
        );
        assert!(text.contains("keep one"), "{text}");
    }

    #[test]
    fn bad_names_and_counts_are_configuration_errors() {
        refused(QueueSpec::new(""));
        refused(QueueSpec::new("x".repeat(256)));
        refused(QueueSpec::new("q").dead_letter_queue("x".repeat(256), 5));
        refused(QueueSpec::new("q").dead_letter_queue("q.dead", 0));
        refused(QueueSpec::new("q").argument("x".repeat(256), 1));
    }

    #[test]
    fn rabbit_settings_are_one_extension_and_an_argument_wins_over_a_mapped_one() {
        let spec = QueueSpec::new("q.fifo")
            .quorum()
            .durable(false)
            .exclusive()
            .auto_delete()
            .max_priority(3)
            .argument("x-single-active-consumer", false);
        let declaration = declared(spec);
        assert!(!declaration.durable && declaration.exclusive && declaration.auto_delete);
        assert!(declaration.vanishes());
        assert_eq!(
            argument(&declaration, "x-single-active-consumer"),
            Some(false.into())
        );
        assert_eq!(argument(&declaration, "x-max-priority"), Some(3u8.into()));
        assert_eq!(
            argument(&declaration, "x-queue-type"),
            Some("quorum".into())
        );
    }

    #[test]
    fn the_dead_letter_target_comes_from_the_declaration() {
        assert_eq!(declared(QueueSpec::new("q")).dead_letter_target(), None);
        assert_eq!(
            declared(QueueSpec::new("q").dead_letter_exchange("dlx")).dead_letter_target(),
            Some(("dlx", "q"))
        );
        assert_eq!(
            declared(
                QueueSpec::new("q")
                    .dead_letter_exchange("")
                    .dead_letter_routing_key("q.dead")
            )
            .dead_letter_target(),
            Some(("", "q.dead"))
        );
    }

    #[test]
    fn a_quorum_queues_delay_queue_is_a_quorum_queue_of_its_own_name_dead_lettering_at_least_once()
    {
        let quorum = declared(QueueSpec::new("q").quorum());
        assert_eq!(default_delay_queue("q", Some(&quorum)), "q.delay.quorum");
        assert_eq!(default_delay_queue("q", None), "q.delay");
        let classic = declared(QueueSpec::new("q"));
        assert_eq!(default_delay_queue("q", Some(&classic)), "q.delay");

        let delay = Declaration::delay_queue("q.delay.quorum", "q", Some(&quorum));
        assert!(delay.is_quorum() && delay.durable && !delay.vanishes());
        assert_eq!(delay.dead_letter_target(), Some(("", "q")));
        assert_eq!(
            argument(&delay, "x-dead-letter-strategy"),
            Some("at-least-once".into())
        );
        assert_eq!(
            argument(&delay, "x-overflow"),
            Some("reject-publish".into())
        );
        assert!(!Declaration::delay_queue("q.delay", "q", Some(&classic)).is_quorum());
    }

    #[test]
    fn a_delay_queue_dead_letters_back_and_lives_as_long_as_its_queue() {
        let delay = Declaration::delay_queue("q.delay", "q", None);
        assert_eq!(delay.dead_letter_target(), Some(("", "q")));
        assert!(!delay.vanishes());
        let exclusive = declared(QueueSpec::new("q").durable(false).exclusive());
        let delay = Declaration::delay_queue("q.delay", "q", Some(&exclusive));
        assert!(delay.exclusive && !delay.durable);
    }
}
