//! `conveyor depth QUEUE… [--watch [SECONDS]]`.

use std::time::Duration;

use conveyor::QueueDepth;

use crate::interrupt::Interrupt;
use crate::target::Inspect;
use crate::{Failure, out};

/// Prints the queues' depths ([`Inspect::depth`]: a queue that does not exist fails the
/// command); with `every`, again in place until interrupted (or until standard output is
/// closed).
pub async fn run<B: Inspect>(
    broker: &B,
    queues: &[String],
    every: Option<Duration>,
) -> Result<(), Failure> {
    let Some(every) = every else {
        return out::print(&table(queues, &read(broker, queues).await?));
    };
    if every.is_zero() {
        return Err(Failure::usage("--watch takes a positive number of seconds"));
    }
    let mut interrupt = Interrupt::listen()?;
    let mut shown_lines = 0;
    loop {
        let depths = tokio::select! {
            () = interrupt.recv() => return Ok(()),
            depths = read(broker, queues) => depths?,
        };
        let text = table(queues, &depths);
        // Back to the first line of the table shown before, and clear from there down.
        if shown_lines > 0 {
            out::print(&format!("\x1b[{shown_lines}F\x1b[J{text}"))?;
        } else {
            out::print(&text)?;
        }
        shown_lines = text.lines().count();
        tokio::select! {
            () = interrupt.recv() => return Ok(()),
            () = tokio::time::sleep(every) => {}
        }
    }
}

async fn read<B: Inspect>(broker: &B, queues: &[String]) -> Result<Vec<QueueDepth>, Failure> {
    let mut depths = Vec::with_capacity(queues.len());
    for queue in queues {
        let depth = broker
            .depth(queue)
            .await
            .map_err(|error| Failure::call(&format!("reading the depth of `{queue}`"), &error))?;
        depths.push(depth);
    }
    Ok(depths)
}

/// The depths as an aligned table, a line per queue.
fn table(queues: &[String], depths: &[QueueDepth]) -> String {
    let width = queues.iter().map(String::len).max().unwrap_or(0).max(5);
    let mut text = format!(
        "{:<width$}  {:>9}  {:>9}  {:>9}\n",
        "QUEUE", "READY", "IN FLIGHT", "DELAYED"
    );
    for (queue, depth) in queues.iter().zip(depths) {
        text.push_str(&format!(
            "{queue:<width$}  {:>9}  {:>9}  {:>9}\n",
            depth.ready,
            known(depth.in_flight),
            known(depth.delayed)
        ));
    }
    text
}

fn known(count: Option<u64>) -> String {
    count.map_or_else(|| "-".to_string(), |count| count.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_aligns_and_marks_what_the_broker_does_not_say() {
        let queues = ["orders".to_string(), "orders-dead".to_string()];
        let depths = [
            QueueDepth::new(12).in_flight(3).delayed(0),
            QueueDepth::new(4),
        ];
        assert_eq!(
            table(&queues, &depths),
            "QUEUE            READY  IN FLIGHT    DELAYED\n\
             orders              12          3          0\n\
             orders-dead          4          -          -\n"
        );
    }
}
