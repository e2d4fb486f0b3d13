//! Sequential dispatch: the mount's own loop runs the handler for each delivery in turn.

use std::pin::pin;
use std::sync::Arc;

use super::{End, Received, Retries, Run, StopOnDrain, finish, handle_one, receive};
use crate::error::Error;
use crate::handler::CallOne;
use crate::telemetry::Arrival;
use crate::transport::Subscriber;

/// Nothing runs side by side and the queue's order holds, retries included: a delivery to
/// retry runs again before the next one is taken. When the app starts draining while a
/// handler runs, the subscriber stops receiving at once, handing back what it read ahead.
/// The handler's future lives on this loop's stack: no task, no allocation per delivery.
pub(super) async fn drive<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    mut run: Run,
) -> Result<(), Error> {
    let mut stop = StopOnDrain::new(&run);
    let end: End = loop {
        match receive(&mut subscriber, &mut run).await {
            Received::Delivery(delivery) => {
                // Pinned where it is made: handing it over by value would copy the
                // whole future (handler's included) once more per delivery.
                let handled = pin!(handle_one(
                    &*handler,
                    delivery,
                    &run,
                    Retries::InPlace,
                    Arrival::none()
                ));
                stop.run(handled, &mut subscriber).await;
            }
            other => break other.into(),
        }
    };
    stop.finish(&mut subscriber).await;
    finish(subscriber, &run, end).await
}
