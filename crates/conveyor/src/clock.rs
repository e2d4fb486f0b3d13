//! The clock of the metrics' durations (the handler's run, the head-of-line wait).
//!
//! A [`Tick`] is a raw reading of [quanta](https://docs.rs/quanta)'s clock: the CPU's
//! time-stamp counter where it is invariant, the monotonic clock elsewhere. It is 8 bytes,
//! so it fits in a [`Delivery`](crate::Delivery) beside the rest, and it turns into
//! nanoseconds only when two readings are subtracted. A `std::time::Instant` is twice
//! the size, and kept in the delivery as nanoseconds since an epoch it cost a subtraction
//! at each end (about 150 instructions per delivery under any-worker, against 30 here).
//!
//! Without the `metrics` feature a `Tick` cannot be made: an `Option<Tick>` is then
//! always `None`, and takes no room.

#[cfg(feature = "metrics")]
mod enabled {
    use std::num::NonZeroU64;
    use std::sync::OnceLock;

    /// One reading of the metrics' clock.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Tick(NonZeroU64);

    /// The process's clock, calibrated against the monotonic clock when first asked for
    /// (quanta keeps one calibration per process, shared with any other user).
    fn clock() -> &'static quanta::Clock {
        static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
        CLOCK.get_or_init(quanta::Clock::new)
    }

    impl Tick {
        /// Now.
        #[inline]
        pub(crate) fn now() -> Tick {
            // A counter at 0 is only ever seen in a mock; 1 is as good.
            Tick(NonZeroU64::new(clock().raw()).unwrap_or(NonZeroU64::MIN))
        }

        /// Seconds from `earlier` to this reading; 0 if this one is not after it.
        #[inline]
        pub(crate) fn seconds_since(self, earlier: Tick) -> f64 {
            let nanos = clock().delta_as_nanos(earlier.0.get(), self.0.get());
            // Exact below 2^53 ns (104 days), far beyond any run or wait.
            nanos as f64 / 1e9
        }

        /// Seconds since this reading.
        #[inline]
        pub(crate) fn elapsed_seconds(self) -> f64 {
            Tick::now().seconds_since(self)
        }

        /// Calibrates the clock now, so that the first delivery does not pay for it.
        pub(crate) fn calibrate() {
            clock();
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_reading_counts_the_time_since_an_earlier_one_and_never_less_than_nothing() {
            // The clock under test is the process's real clock: read it inside two
            // readings of std's, 20 ms apart at least, so that a pause anywhere (a busy
            // machine) widens the outer bound and never breaks the test.
            let outer = std::time::Instant::now();
            let earlier = Tick::now();
            let inner = std::time::Instant::now();
            while inner.elapsed() < std::time::Duration::from_millis(20) {
                std::thread::yield_now();
            }
            let later = Tick::now();
            let most = outer.elapsed().as_secs_f64();
            let seconds = later.seconds_since(earlier);
            // 1% for the calibration against the monotonic clock.
            assert!(seconds >= 0.020 * 0.99, "{seconds}");
            assert!(seconds <= most * 1.01, "{seconds} > {most}");
            assert_eq!(earlier.seconds_since(later), 0.0);
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) use enabled::Tick;

/// Without the `metrics` feature: no reading can be made.
#[cfg(not(feature = "metrics"))]
#[derive(Clone, Copy, Debug)]
pub(crate) enum Tick {}
