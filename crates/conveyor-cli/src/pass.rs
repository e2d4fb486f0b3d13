//! One pass over a queue's ready messages: received and held, until the command settles
//! each (a delivery dropped unsettled goes back to the queue).

use std::time::Duration;

use conveyor::{Broker, Delivery, Source, SubscribeSettings, Subscriber};

use crate::Failure;
use crate::interrupt::Interrupt;
use crate::target::Inspect;

/// How long a pass waits for the next message before it takes the queue to be done:
/// ready messages that another consumer took meanwhile never come. Generous: a pass
/// waits this long only when something holds messages back, never in a pass that sees
/// every message ready, and a busy broker may take seconds to answer.
pub const IDLE: Duration = Duration::from_secs(15);

/// A subscription on one queue, holding up to its window of messages.
pub struct Pass<S> {
    queue: String,
    subscriber: S,
}

/// The pass of a broker's queue.
pub type PassOf<B> = Pass<<<B as Broker>::Queue as Source>::Subscriber>;

/// How many messages of `queue` a pass can receive now ([`Inspect::receivable`]): those
/// ready. Fails for a queue that does not exist.
pub async fn ready<B: Inspect>(broker: &B, queue: &str) -> Result<u64, Failure> {
    broker
        .receivable(queue)
        .await
        .map_err(|error| Failure::call(&format!("reading the depth of `{queue}`"), &error))
}

/// Subscribes to `queue`, holding at most `window` messages unsettled.
pub async fn open<B: Inspect>(
    broker: &B,
    queue: &str,
    window: usize,
) -> Result<PassOf<B>, Failure> {
    let subscriber = broker
        .inspect(queue)
        .subscribe(SubscribeSettings::new(window.max(1)))
        .await
        .map_err(|error| Failure::call(&format!("receiving from `{queue}`"), &error))?;
    Ok(Pass {
        queue: queue.to_string(),
        subscriber,
    })
}

impl<S: Subscriber> Pass<S> {
    /// The next message, or `None` once none comes for a while (or the queue is gone).
    pub async fn next(&mut self) -> Result<Option<Delivery>, Failure> {
        match tokio::time::timeout(IDLE, self.subscriber.recv()).await {
            Err(_) | Ok(None) => Ok(None),
            Ok(Some(Ok(delivery))) => Ok(Some(delivery)),
            Ok(Some(Err(error))) => Err(Failure::call(
                &format!("receiving from `{}`", self.queue),
                &error,
            )),
        }
    }

    /// Hands back what the transport read ahead, and closes the subscription once what
    /// was settled has reached the broker.
    pub async fn close(mut self) {
        self.subscriber.stop_receiving().await;
        self.subscriber.close().await;
    }

    /// [`close`](Self::close), unless a second signal comes first (`interrupted`: the
    /// first came already): `Err(Interrupted)` then, and the command leaves at once, what
    /// is held going back when the connection ends and removals not yet sent leaving
    /// their messages to be sent again. A first signal lets the close finish, so that
    /// what was settled reaches the broker.
    pub async fn close_unless_interrupted_twice(
        self,
        interrupt: &mut Interrupt,
        mut interrupted: bool,
    ) -> Result<(), Interrupted> {
        let close = self.close();
        tokio::pin!(close);
        loop {
            tokio::select! {
                biased;
                () = interrupt.recv() => {
                    if interrupted {
                        return Err(Interrupted);
                    }
                    interrupted = true;
                }
                () = &mut close => return Ok(()),
            }
        }
    }
}

/// A second signal came while a pass was closing.
#[derive(Debug)]
pub struct Interrupted;
