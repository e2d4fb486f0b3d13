//! The channels a broker opens: for one operation, for publishing (confirm mode, waiting
//! out a blocked connection), and for requests.

use super::*;

impl LapinBroker {
    /// The publisher behind [`Publisher`] on the broker: the one opened before, unless
    /// its channel has closed (a channel error, or the connection closed for good), in
    /// which case a new one. A channel waiting for the connection to recover is kept:
    /// the publish waits for the recovery.
    ///
    /// Publishing takes a plain lock and a reference count; only opening a publisher
    /// waits on an async lock.
    pub(super) async fn confirm_publisher(&self) -> Result<Arc<LapinPublisher>, LapinError> {
        let current = || {
            conveyor::kit::lock(&self.inner.publisher)
                .as_ref()
                .filter(|publisher| publisher.is_open())
                .cloned()
        };
        if let Some(publisher) = current() {
            return Ok(publisher);
        }
        self.publishing_connected().await;
        let _opening = self.inner.opening_publisher.lock().await;
        // Another task may have opened one while this one waited.
        if let Some(publisher) = current() {
            return Ok(publisher);
        }
        let publisher = Arc::new(LapinPublisher::open(self.clone()).await?);
        *conveyor::kit::lock(&self.inner.publisher) = Some(publisher.clone());
        Ok(publisher)
    }

    /// The requester, opened by the first request (and again once its channel closed).
    pub(super) async fn requester(&self) -> Result<Arc<Requester>, LapinError> {
        self.publishing_connected().await;
        let mut requester = self.inner.requester.lock().await;
        if let Some(open) = requester.as_ref().filter(|r| r.is_open()) {
            return Ok(open.clone());
        }
        if let Some(closed) = requester.take() {
            closed.close().await;
        }
        let opened = Arc::new(Requester::open(self).await?);
        *requester = Some(opened.clone());
        Ok(opened)
    }

    /// Opens a channel for `purpose` (named in errors) on the consuming connection.
    pub(crate) async fn open_channel(&self, purpose: &str) -> Result<Channel, LapinError> {
        on(&self.inner.connection, purpose).await
    }

    /// Opens a confirm-mode channel for `purpose` (named in errors) on the publishing
    /// connection, within the confirm timeout. A connection a resource alarm blocks
    /// writes nothing, a channel's opening included: unbounded, the opening would wait
    /// for the alarm's end, and every publish waiting on the lock it is opened under with
    /// it. [`LapinError::Blocked`] when the connection is blocked at the timeout.
    pub(crate) async fn open_publishing_channel(
        &self,
        purpose: &str,
    ) -> Result<Channel, LapinError> {
        let failed = |source| LapinError::Channel {
            purpose: purpose.to_string(),
            source,
        };
        let opening = async {
            self.publishing_unblocked().await;
            let channel = on(&self.inner.publishing, purpose).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(failed)?;
            Ok(channel)
        };
        let after = self.inner.confirm_timeout;
        match tokio::time::timeout(after, opening).await {
            Ok(opened) => opened,
            Err(_) => {
                let destination = purpose.to_string();
                Err(if self.inner.publishing.status().blocked() {
                    LapinError::Blocked { destination, after }
                } else {
                    LapinError::ConfirmTimeout { destination, after }
                })
            }
        }
    }

    /// Resolves once the publishing connection is not being recovered, or the confirm
    /// timeout has passed. lapin opens no channel on a connection it is recovering: a
    /// publish about to open one waits for the recovery as a publish on an open channel
    /// does (then the open fails, saying why). A connection closed for good (by
    /// [`close`](Self::close)) is not waited for. Waited for before any lock a channel is
    /// opened under, so that publishes waiting on that lock do not each wait the timeout
    /// in turn.
    pub(crate) async fn publishing_connected(&self) {
        let status = self.inner.publishing.status();
        let recovered = conveyor::kit::wait_for(&self.inner.unblocked, || {
            (!status.connecting() && !status.reconnecting()).then_some(())
        });
        let _ = tokio::time::timeout(self.inner.confirm_timeout, recovered).await;
    }

    /// Resolves once the publishing connection is not blocked by a resource alarm (at
    /// once, mostly).
    pub(crate) async fn publishing_unblocked(&self) {
        self.publishing_block().over().await;
    }

    /// The publishing connection's block by a resource alarm, to wait for its end.
    pub(crate) fn publishing_block(&self) -> Block {
        Block {
            status: self.inner.publishing.status().clone(),
            unblocked: self.inner.unblocked.clone(),
        }
    }

    /// The publishing connection's negotiated settings, for its frame limit.
    pub(crate) fn publishing_settings(&self) -> lapin::Configuration {
        self.inner.publishing.configuration().clone()
    }

    /// The publishing connection's frame limit (frame_max), read without a copy of its
    /// settings.
    pub(crate) fn publishing_frame_max(&self) -> u32 {
        self.inner.publishing.configuration().frame_max()
    }
}

/// Whether RabbitMQ blocks a connection (a resource alarm), and the notice of its end.
#[derive(Clone)]
pub(crate) struct Block {
    status: lapin::ConnectionStatus,
    unblocked: Arc<tokio::sync::Notify>,
}

impl Block {
    /// Resolves once the connection is not blocked (at once, mostly).
    pub(crate) async fn over(&self) {
        conveyor::kit::wait_for(&self.unblocked, || (!self.status.blocked()).then_some(())).await;
    }
}
