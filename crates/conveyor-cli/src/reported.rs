//! What the transports report while a command runs. A transport logs what it cannot
//! return (a removal the broker refused for good after the command moved on); a command
//! line has no log to read, so the first error Conveyor's crates log fails the command
//! instead of letting it end as if all went well. Warnings are passed over: they say
//! what the transport retries by itself (a visibility renewal, a batch entry).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The first error Conveyor's crates logged, once installed.
#[derive(Clone, Default)]
pub struct Reported(Arc<Mutex<Option<String>>>);

impl Reported {
    /// Installs the capture as the process's subscriber (once, before the command).
    pub fn install() -> Reported {
        let reported = Reported::default();
        let subscriber = tracing_subscriber::registry().with(reported.clone());
        // Only fails if a subscriber is set already, which this binary never does.
        let _ = tracing::subscriber::set_global_default(subscriber);
        reported
    }

    /// The first report, as one line.
    pub fn first(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn wanted(metadata: &Metadata<'_>) -> bool {
    *metadata.level() == Level::ERROR && metadata.target().starts_with("conveyor")
}

impl<S: Subscriber> Layer<S> for Reported {
    fn enabled(&self, metadata: &Metadata<'_>, _cx: Context<'_, S>) -> bool {
        wanted(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            let mut line = Line::default();
            event.record(&mut line);
            *slot = Some(line.into_text());
        }
    }
}

/// An event's message, then its fields as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: Vec<String>,
}

impl Line {
    fn into_text(self) -> String {
        if self.fields.is_empty() {
            self.message
        } else {
            format!("{} ({})", self.message, self.fields.join(", "))
        }
    }
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields.push(format!("{}={value:?}", field.name()));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_of_conveyor_is_kept_as_one_line() {
        let reported = Reported::default();
        let subscriber = tracing_subscriber::registry().with(reported.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "conveyor_sqs", "fine");
            tracing::warn!(target: "conveyor_sqs", "retrying by itself");
            tracing::error!(target: "other_crate", "not ours");
            tracing::error!(target: "conveyor_sqs", queue = "dead", "cannot delete");
            tracing::error!(target: "conveyor_sqs", "later");
        });
        assert_eq!(
            reported.first().as_deref(),
            Some("cannot delete (queue=dead)")
        );
    }
}
