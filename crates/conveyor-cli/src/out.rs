//! Standard output, written so that a failed write is an error the command handles
//! rather than a panic (`print!` panics). A reader gone away (`conveyor peek q | head`)
//! is no one's error: the command stops, hands back what it holds, and exits 0 without
//! a word (`Failure::output_closed`); any other failed write fails the command.

use std::io::{self, Write};

use crate::Failure;

/// Writes `text` to standard output, and flushes it.
pub fn print(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|error| failure(&error))
}

/// What a failed write to standard output makes of the command.
fn failure(error: &io::Error) -> Failure {
    if error.kind() == io::ErrorKind::BrokenPipe {
        Failure::output_closed()
    } else {
        Failure::broker(format!("cannot write to standard output: {error}"))
    }
}
