//! The way past the portable view to AMQP itself, for code written for RabbitMQ: a
//! delivery's AMQP properties as received, typed header values included, to read or to
//! publish again with [`LapinBroker::publish_amqp`](crate::LapinBroker::publish_amqp).

use conveyor::Delivery;
use lapin::BasicProperties;

/// The AMQP properties `delivery` was received with, if it came from RabbitMQ and is not
/// settled yet: what the core's [`Delivery::headers`] leaves out or turns into text (the
/// `type`, `app_id`, `timestamp`, `user_id` properties; numbers, booleans, arrays and
/// tables in the header table). `None` for another transport's delivery.
///
/// ```
/// # fn f(delivery: &conveyor::Delivery) {
/// if let Some(properties) = conveyor_lapin::amqp_properties(delivery) {
///     let kind = properties.kind().as_ref().map(|kind| kind.as_str());
///     println!("an AMQP message of type {kind:?}");
/// }
/// # }
/// ```
pub fn amqp_properties(delivery: &Delivery) -> Option<BasicProperties> {
    delivery.transport_record::<BasicProperties>()
}
