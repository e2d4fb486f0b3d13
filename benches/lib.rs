//! Conveyor benchmarks: helpers shared by the bench targets.
//!
//! [`CountingAlloc`] counts heap allocations made inside a window that a bench opens with
//! [`start_counting`] and closes with [`stop_counting`]. Install it as the bench binary's
//! global allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: conveyor_benches::CountingAlloc = conveyor_benches::CountingAlloc;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Whether a window is open.
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Allocations (including reallocations) in the current or last window.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Bytes asked for by those allocations.
static BYTES: AtomicU64 = AtomicU64::new(0);
/// How many more allocations in the window get their backtrace printed.
static TRACES_LEFT: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Set while this thread prints a backtrace, whose own allocations are not counted.
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

/// What a window allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allocations {
    /// Allocations, reallocations included.
    pub count: u64,
    /// Bytes asked for.
    pub bytes: u64,
}

/// Opens a counting window, starting from zero. The first `traces` allocations in it
/// print their backtrace to stderr (build with debug info for file:line).
pub fn start_counting(traces: u32) {
    ALLOCATIONS.store(0, Ordering::Relaxed);
    BYTES.store(0, Ordering::Relaxed);
    TRACES_LEFT.store(traces, Ordering::Relaxed);
    COUNTING.store(true, Ordering::SeqCst);
}

/// Closes the window and returns what was allocated in it.
pub fn stop_counting() -> Allocations {
    COUNTING.store(false, Ordering::SeqCst);
    Allocations {
        count: ALLOCATIONS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

/// The system allocator, counting allocations while a window is open.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAlloc;

impl CountingAlloc {
    fn record(size: usize) {
        if !COUNTING.load(Ordering::Relaxed) {
            return;
        }
        // `try_with` fails only while the thread is being torn down: count, don't trace.
        let tracing = TRACING.try_with(Cell::get).unwrap_or(true);
        if tracing {
            return;
        }
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
        let trace = TRACES_LEFT
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if trace {
            TRACING.set(true);
            let backtrace = Backtrace::force_capture();
            eprintln!("allocation of {size} bytes in the window:\n{backtrace}");
            TRACING.set(false);
        }
    }
}

// SAFETY: every call is forwarded unchanged to `System`; counting touches only atomics
// and a const-initialised thread-local, and printing a backtrace happens with counting
// turned off for the thread, so it cannot recurse.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::record(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::record(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::record(new_size);
        // SAFETY: `ptr` and `layout` come from this allocator, that is from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` come from this allocator, that is from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The number in the environment variable `name`, or `default` when it is unset or not a
/// number: how the bench binaries take their sizes.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Turns spans and metrics on for the whole process, as `dispatch --observe` and
/// `observe_floor` measure them: Conveyor's INFO spans recorded by a `tracing` registry
/// (behind a `Targets` filter, as a service would set one), and every metric by a
/// Prometheus recorder (never scraped).
///
/// Not inlined: the subscriber's code (the `Layered` subscriber and the registry's slab,
/// instantiated where it becomes a `dyn Subscriber`) is compiled in this library, so it
/// is the same code whatever changes in Conveyor. Inlined into the bench binary, it was
/// about 8 instructions per delivery cheaper, but moved with the binary's codegen units:
/// a change to Conveyor's dispatch code once left `sharded_slab::Shard::init_with` out of
/// line, 34 instructions more per span in every mode.
#[cfg(feature = "observe")]
pub fn observe() -> Result<(), Box<dyn std::error::Error>> {
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::registry().with(
        tracing_subscriber::filter::Targets::new().with_target("conveyor", tracing::Level::INFO),
    );
    tracing::subscriber::set_global_default(subscriber)?;
    metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    Ok(())
}
