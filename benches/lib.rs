//! Conveyor benchmarks.
