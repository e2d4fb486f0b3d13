//! Ctrl-C and SIGTERM, listened for from the moment a command asks: on Unix, a signal
//! that comes before the command first waits for one is not lost (nor does it kill the
//! process with messages held). Elsewhere only Ctrl-C is heard, from the first wait.

use crate::Failure;

/// Listens for SIGINT and SIGTERM.
pub struct Interrupt {
    #[cfg(unix)]
    signals: [tokio::signal::unix::Signal; 2],
}

impl Interrupt {
    /// Starts listening.
    pub fn listen() -> Result<Self, Failure> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind| {
                signal(kind)
                    .map_err(|error| Failure::broker(format!("cannot listen for signals: {error}")))
            };
            Ok(Interrupt {
                signals: [
                    listen(SignalKind::interrupt())?,
                    listen(SignalKind::terminate())?,
                ],
            })
        }
        #[cfg(not(unix))]
        Ok(Interrupt {})
    }

    /// Resolves once a signal has come (at once if one came since `listen`).
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            let [interrupt, terminate] = &mut self.signals;
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
