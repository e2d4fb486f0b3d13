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
    /// declared again without them, a binding would fail once they are gone.
    left_out: std::collections::HashSet<String>,
}

impl Record {
    /// Notes a declaration that succeeded.
    pub(crate) fn declared(&mut self, declared: Declared) {
        let left_out = match &declared {
            Declared::Exchange(spec) if spec.is_auto_delete() => Some(spec.name()),
            Declared::Queue(declaration) if declaration.is_auto_delete() => {
                Some(declaration.name())
            }
            _ => None,
        };
        if let Some(name) = left_out {
            self.left_out.insert(name.to_string());
            let name = name.to_string();
            self.declared.retain(|known| match known {
                Declared::Binding(binding) => binding.queue() != name && binding.exchange() != name,
                _ => true,
            });
        }
        let kept = match &declared {
            Declared::Exchange(spec) => !spec.is_passive() && left_out.is_none(),
            Declared::Queue(_) => left_out.is_none(),
            Declared::Binding(binding) => {
                !self.left_out.contains(binding.queue())
                    && !self.left_out.contains(binding.exchange())
            }
        };
        self.declared.retain(|known| !known.same(&declared));
        if kept {
            self.declared.push(declared);
        }
    }

    /// Forgets a queue that was deleted, and its bindings.
    pub(crate) fn queue_deleted(&mut self, name: &str) {
        self.left_out.remove(name);
        self.declared.retain(|known| match known {
            Declared::Queue(declaration) => declaration.name() != name,
            Declared::Binding(binding) => binding.queue() != name,
            Declared::Exchange(_) => true,
        });
    }

    /// Forgets an exchange that was deleted, and the bindings to it.
    pub(crate) fn exchange_deleted(&mut self, name: &str) {
        self.left_out.remove(name);
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
}
