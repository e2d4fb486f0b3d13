//! Runnable Conveyor services: see the `[[example]]` targets of this package.

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's pages (`docs/`), compiled and run as doctests so they stay true.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/README.md")]
    struct Contents;
    #[doc = include_str!("../docs/first-service.md")]
    struct FirstService;
    #[doc = include_str!("../docs/dispatch-modes.md")]
    struct DispatchModes;
    #[doc = include_str!("../docs/ordering.md")]
    struct Ordering;
    #[doc = include_str!("../docs/failures.md")]
    struct Failures;
    #[doc = include_str!("../docs/shutdown.md")]
    struct Shutdown;
    #[doc = include_str!("../docs/observability.md")]
    struct Observability;
    #[doc = include_str!("../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../docs/migrating.md")]
    struct Migrating;
}
