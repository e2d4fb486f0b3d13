//! `conveyor peek QUEUE [-n N]`.

use conveyor::{Broker, Settlement};

use crate::pass::{open, ready};
use crate::{Failure, show};

/// Shows up to `count` ready messages of `queue`, then hands them all back. Each is
/// received once more by the broker's count: SQS counts the receive towards the queue's
/// max receive count, and a quorum queue towards its delivery limit.
pub async fn run<B: Broker>(broker: &B, queue: &str, count: usize) -> Result<(), Failure> {
    let ready = ready(broker, queue).await?;
    let wanted = usize::try_from(ready).unwrap_or(usize::MAX).min(count);
    if wanted == 0 {
        println!("`{queue}` has no message ready");
        return Ok(());
    }
    let mut pass = open(broker, queue, wanted).await?;
    // Held until all are shown: one handed back at once could come again in this pass.
    let mut held = Vec::with_capacity(wanted);
    while held.len() < wanted {
        let Some(delivery) = pass.next().await? else {
            break;
        };
        print!("{}", show::delivery(held.len() + 1, &delivery));
        held.push(delivery);
    }
    let shown = held.len();
    for delivery in held {
        delivery.settle(Settlement::Release);
    }
    pass.close().await;
    println!("--- {shown} shown of {ready} ready in `{queue}`; all handed back");
    Ok(())
}
