//! Runnable Conveyor services: see the `[[example]]` targets of this package.

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
