//! Typed shared state that handlers extract with [`State`](crate::State).

use std::any::{Any, TypeId, type_name};
use std::collections::HashMap;
use std::fmt;

/// The app's shared values, one per type.
#[derive(Default)]
pub struct StateMap {
    values: HashMap<TypeId, (Box<dyn Any + Send + Sync>, &'static str)>,
}

impl StateMap {
    /// Stores `value`, replacing any earlier value of its type.
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        self.values
            .insert(TypeId::of::<T>(), (Box::new(value), type_name::<T>()));
    }

    /// The value of type `T`, if one was stored.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|(value, _)| value.downcast_ref())
    }

    /// Whether a value of type `T` was stored.
    pub fn contains<T: 'static>(&self) -> bool {
        self.values.contains_key(&TypeId::of::<T>())
    }
}

impl fmt::Debug for StateMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.values.values().map(|(_, name)| name))
            .finish()
    }
}
