//! Runnable Conveyor services: see the `[[example]]` targets of this package.
