//! What a broker declared on its topology channel, to declare again on the next one.
//!
//! lapin declares again, after a lost connection, what a channel itself declared. When
//! the broker closes the topology channel (over a declaration it refused), the channel
//! opened next starts with nothing: an exclusive queue's binding, say, would not come
//! back with the connection, and its subscription would wait for messages no exchange
//! routes to it any more. So the broker keeps its own record and declares it again on
//! each new topology channel.
//!
//! Auto-delete queues and exchanges are left out: declared again at once, one the broker
//! had deleted (its last consumer or binding gone) would come back to stay.

use std::collections::VecDeque;
use std::sync::Arc;

use lapin::Channel;

use crate::error::LapinError;
use crate::spec::Declaration;
use crate::topology::{Binding, ExchangeSpec};

/// One declaration made on a topology channel.
#[derive(Clone, Debug)]
pub(crate) enum Declared {
    Exchange(ExchangeSpec),
    Queue(Arc<Declaration>),
    Binding(Binding),
}

impl Declared {
    /// Makes it on `channel`; a refusal closes the channel.
    pub(crate) async fn declare(&self, channel: &Channel) -> Result<(), LapinError> {
        match self {
            Declared::Exchange(spec) => spec.declare(channel).await,
            Declared::Queue(declaration) => declaration.declare(channel).await,
            Declared::Binding(binding) => binding.declare(channel).await,
        }
    }

    fn same(&self, other: &Declared) -> bool {
        match (self, other) {
            (Declared::Exchange(a), Declared::Exchange(b)) => a.name() == b.name(),
            (Declared::Queue(a), Declared::Queue(b)) => a.name() == b.name(),
            (Declared::Binding(a), Declared::Binding(b)) => a == b,
            _ => false,
        }
    }
}

/// The declarations in the order they were made (an exchange and a queue before their
/// binding), the last of each name kept.
#[derive(Debug, Default)]
pub(crate) struct Record {
    declared: Vec<Declared>,
    /// The auto-delete queues and exchanges left out, whose bindings are left out too:
    /// declared again without them, a binding would fail once they are gone. The latest
    /// [`LEFT_OUT_KEPT`] only: the broker deletes them without telling, so a service that
    /// makes one per request would otherwise grow this without end. A binding to one
    /// forgotten here is recorded, and forgotten in turn the first time the broker
    /// refuses it.
    left_out: VecDeque<Named>,
}

/// How many left-out names a record keeps.
const LEFT_OUT_KEPT: usize = 1024;

/// A queue or an exchange, by name: the two have names of their own.
#[derive(Debug, PartialEq, Eq)]
enum Named {
    Queue(String),
    Exchange(String),
}

impl Record {
    /// Notes a declaration that succeeded.
    pub(crate) fn declared(&mut self, declared: Declared) {
        let kept = match &declared {
            Declared::Exchange(spec) if spec.is_passive() => false,
            Declared::Exchange(spec) => self.named(
                Named::Exchange(spec.name().to_string()),
                spec.is_auto_delete(),
            ),
            Declared::Queue(declaration) => self.named(
                Named::Queue(declaration.name().to_string()),
                declaration.is_auto_delete(),
            ),
            Declared::Binding(binding) => {
                !self.left_out.iter().any(|named| binding_of(binding, named))
            }
        };
        self.declared.retain(|known| !known.same(&declared));
        if kept {
            self.declared.push(declared);
        }
    }

    /// Notes a queue or exchange declared now, auto-delete or not (whatever an earlier
    /// declaration of its name was); whether it is kept. An auto-delete one is left
    /// out, and its bindings with it.
    fn named(&mut self, named: Named, auto_delete: bool) -> bool {
        self.left_out.retain(|known| *known != named);
        if !auto_delete {
            return true;
        }
        self.declared.retain(
            |known| !matches!(known, Declared::Binding(binding) if binding_of(binding, &named)),
        );
        if self.left_out.len() == LEFT_OUT_KEPT {
            self.left_out.pop_front();
        }
        self.left_out.push_back(named);
        false
    }

    /// Forgets a queue that was deleted, and its bindings.
    pub(crate) fn queue_deleted(&mut self, name: &str) {
        self.left_out
            .retain(|known| !matches!(known, Named::Queue(n) if n == name));
        self.declared.retain(|known| match known {
            Declared::Queue(declaration) => declaration.name() != name,
            Declared::Binding(binding) => binding.queue() != name,
            Declared::Exchange(_) => true,
        });
    }

    /// Forgets an exchange that was deleted, and the bindings to it.
    pub(crate) fn exchange_deleted(&mut self, name: &str) {
        self.left_out
            .retain(|known| !matches!(known, Named::Exchange(n) if n == name));
        self.declared.retain(|known| match known {
            Declared::Exchange(spec) => spec.name() != name,
            Declared::Binding(binding) => binding.exchange() != name,
            Declared::Queue(_) => true,
        });
    }

    /// Forgets one the broker no longer takes.
    pub(crate) fn forget(&mut self, declared: &Declared) {
        self.declared.retain(|known| !known.same(declared));
    }

    /// Every declaration, in order.
    pub(crate) fn all(&self) -> Vec<Declared> {
        self.declared.clone()
    }
}

/// Whether `binding` binds the queue or is from the exchange `named`.
fn binding_of(binding: &Binding, named: &Named) -> bool {
    match named {
        Named::Queue(name) => binding.queue() == name,
        Named::Exchange(name) => binding.exchange() == name,
    }
}

#[cfg(test)]
mod tests {
    use conveyor::QueueSpec;

    use super::*;
    use crate::RabbitQueueSpec;
    use crate::topology::ExchangeType;

    fn queue(spec: QueueSpec) -> Declared {
        Declared::Queue(Arc::new(Declaration::from_spec(&spec).unwrap()))
    }

    fn names(record: &Record) -> Vec<String> {
        record
            .all()
            .iter()
            .map(|declared| match declared {
                Declared::Exchange(spec) => format!("exchange {}", spec.name()),
                Declared::Queue(declaration) => format!("queue {}", declaration.name()),
                Declared::Binding(binding) => {
                    format!("binding {} {}", binding.exchange(), binding.queue())
                }
            })
            .collect()
    }

    #[test]
    fn declarations_are_kept_in_order_the_last_of_each_name_and_deletions_take_their_bindings() {
        let mut record = Record::default();
        record.declared(Declared::Exchange(ExchangeSpec::new(
            "e",
            ExchangeType::Fanout,
        )));
        record.declared(queue(QueueSpec::new("q")));
        record.declared(Declared::Binding(Binding::new("q", "e", "")));
        record.declared(Declared::Binding(Binding::new("q", "e", "")));
        record.declared(queue(QueueSpec::new("q").durable(false)));
        assert_eq!(names(&record), ["exchange e", "binding e q", "queue q"]);
        record.queue_deleted("q");
        assert_eq!(names(&record), ["exchange e"]);
        record.declared(Declared::Binding(Binding::new("r", "e", "")));
        record.exchange_deleted("e");
        assert!(names(&record).is_empty());
    }

    #[test]
    fn checks_and_auto_delete_declarations_are_not_made_again() {
        let mut record = Record::default();
        record.declared(Declared::Exchange(
            ExchangeSpec::new("e", ExchangeType::Fanout).passive(),
        ));
        record.declared(Declared::Exchange(
            ExchangeSpec::new("f", ExchangeType::Fanout).auto_delete(),
        ));
        record.declared(queue(QueueSpec::new("q").auto_delete()));
        assert!(names(&record).is_empty());
        // Nor the bindings of those: without them, they would fail once those are gone.
        record.declared(Declared::Binding(Binding::new("q", "g", "")));
        record.declared(Declared::Binding(Binding::new("r", "f", "")));
        record.declared(Declared::Binding(Binding::new("r", "g", "")));
        assert_eq!(names(&record), ["binding g r"]);
        // A binding made before its queue turned out to be auto-delete goes too.
        record.declared(queue(QueueSpec::new("r").auto_delete()));
        assert!(names(&record).is_empty());
    }

    /// An auto-delete queue the broker deleted by itself, declared again to last, is made
    /// again with its bindings; and a queue and an exchange of one name are two things.
    #[test]
    fn a_name_declared_again_without_auto_delete_is_made_again_with_its_bindings() {
        let mut record = Record::default();
        record.declared(queue(QueueSpec::new("q").auto_delete()));
        record.declared(queue(QueueSpec::new("q")));
        record.declared(Declared::Binding(Binding::new("q", "e", "")));
        assert_eq!(names(&record), ["queue q", "binding e q"]);

        record.declared(queue(QueueSpec::new("events").auto_delete()));
        record.declared(Declared::Exchange(ExchangeSpec::new(
            "events",
            ExchangeType::Fanout,
        )));
        record.declared(Declared::Binding(Binding::new("q", "events", "")));
        assert_eq!(
            names(&record),
            [
                "queue q",
                "binding e q",
                "exchange events",
                "binding events q"
            ]
        );
    }

    /// Left-out names are kept to a bound: the broker deletes auto-delete queues without
    /// telling, and a service may make one per request.
    #[test]
    fn the_left_out_names_are_kept_to_a_bound() {
        let mut record = Record::default();
        for n in 0..LEFT_OUT_KEPT + 10 {
            record.declared(queue(
                QueueSpec::new(format!("reply-{n}").as_str()).auto_delete(),
            ));
        }
        assert_eq!(record.left_out.len(), LEFT_OUT_KEPT);
        assert_eq!(
            record.left_out.front(),
            Some(&Named::Queue("reply-10".into()))
        );
    }
}
