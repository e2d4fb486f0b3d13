//! `conveyor peek QUEUE [-n N]`.

use conveyor::Settlement;

use crate::interrupt::Interrupt;
use crate::pass::{open, ready};
use crate::target::Inspect;
use crate::{Failure, out, show};

/// Shows up to `count` ready messages of `queue`, then hands them all back (also when
/// interrupted, or when standard output is closed). Each is received once more by the
/// broker's count: SQS counts the receive towards the queue's max receive count, and a
/// quorum queue towards its delivery limit.
pub async fn run<B: Inspect>(broker: &B, queue: &str, count: usize) -> Result<(), Failure> {
    let ready = ready(broker, queue).await?;
    let wanted = usize::try_from(ready).unwrap_or(usize::MAX).min(count);
    if count == 0 {
        return out::print("nothing to show: -n 0\n");
    }
    if wanted == 0 {
        return out::print(&format!("`{queue}` has no message ready\n"));
    }
    // Before any message is held: a signal from here on hands them back.
    let mut interrupt = Interrupt::listen()?;
    let mut pass = open(broker, queue, wanted).await?;
    // Held until all are shown: one handed back at once could come again in this pass.
    let mut held = Vec::with_capacity(wanted);
    let mut interrupted = false;
    let mut output = Ok(());
    // A receive that failed: what is held goes back all the same before it is told.
    let mut failed = None;
    while held.len() < wanted {
        let next = tokio::select! {
            biased;
            () = interrupt.recv() => {
                interrupted = true;
                break;
            }
            next = pass.next() => next,
        };
        let delivery = match next {
            Ok(Some(delivery)) => delivery,
            Ok(None) => break,
            Err(failure) => {
                failed = Some(failure);
                break;
            }
        };
        output = out::print(&show::delivery(held.len() + 1, &delivery));
        held.push(delivery);
        // Standard output gone (`| head`): stop, and hand back all that is held.
        if output.is_err() {
            break;
        }
    }
    let shown = held.len();
    for delivery in held {
        delivery.settle(Settlement::Release);
    }
    // Only a second signal leaves before the messages are handed back; what is held
    // then comes back after the broker's timeout.
    if pass
        .close_unless_interrupted_twice(&mut interrupt, interrupted)
        .await
        .is_err()
    {
        return Err(Failure::interrupted(
            "interrupted twice, before the messages were handed back",
        ));
    }
    if let Some(failure) = failed {
        return Err(failure);
    }
    output?;
    if interrupted {
        return Err(Failure::interrupted(format!(
            "interrupted after showing {shown}; all handed back"
        )));
    }
    out::print(&format!(
        "--- {shown} shown of {ready} ready in `{queue}`; all handed back\n"
    ))
}
