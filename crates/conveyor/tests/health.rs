//! `RunningApp::health`: each mount running, reconnecting, draining or failed, and the
//! live and ready answers a probe needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use conveyor::{
    App, Bytes, Delivery, Error, Health, Json, MemoryBroker, MountState, Settle, Settled, Source,
    SubscribeSettings, Subscriber,
};

async fn ignore(Json(_n): Json<u64>) {}

/// Waits, for at most a minute, until `check` holds for the app's health.
async fn health_until(
    app: &conveyor::RunningApp,
    what: &str,
    check: impl Fn(&Health) -> bool,
) -> Health {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let health = app.health();
        if check(&health) {
            return health;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the health is still {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_started_app_is_live_and_ready_and_draining_is_not_ready() {
    let broker = MemoryBroker::new();
    let app = App::new("health")
        .mount(broker.queue("a"), ignore, |m| m)
        .mount(broker.queue("b"), ignore, |m| m.workers(2))
        .start()
        .await
        .unwrap();
    let health = app.health();
    assert_eq!(health.app, "health");
    assert_eq!(
        health
            .mounts
            .iter()
            .map(|m| (m.queue.as_str(), m.state.clone()))
            .collect::<Vec<_>>(),
        [("a", MountState::Running), ("b", MountState::Running)]
    );
    assert!(health.is_live() && health.is_ready());

    app.stop_receiving();
    let health = app.health();
    assert!(
        health
            .mounts
            .iter()
            .all(|m| m.state == MountState::Draining)
    );
    assert!(health.is_live() && !health.is_ready());
    app.shutdown().await.unwrap();
}

/// A subscription that fails to receive while `down` is set, and otherwise hands out a
/// delivery now and then; its deliveries are settled into the void. Or one that ends at
/// once, or panics.
#[derive(Default)]
struct Flaky {
    down: Arc<AtomicBool>,
    /// Deliveries handed out.
    delivered: Arc<AtomicUsize>,
    /// Receives failed.
    failed: Arc<AtomicUsize>,
    ends: bool,
    panics: bool,
}

struct Void;

impl Settle for Void {
    fn settle(&self, _: Settled<'_>) {}
}

impl Subscriber for Flaky {
    async fn recv(&mut self) -> Option<Result<Delivery, Error>> {
        if self.ends {
            return None;
        }
        assert!(!self.panics, "a transport bug");
        tokio::time::sleep(Duration::from_millis(5)).await;
        if self.down.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Some(Err(Error::config("the broker is away")));
        }
        self.delivered.fetch_add(1, Ordering::SeqCst);
        let payload = Bytes::from_static(b"1");
        Some(Ok(Delivery::new(
            payload,
            "flaky".into(),
            Arc::new(Void),
            0,
        )))
    }

    async fn close(self) {}
}

impl Source for Flaky {
    type Subscriber = Flaky;

    fn queue_name(&self) -> &str {
        "flaky"
    }

    async fn subscribe(self, _: SubscribeSettings) -> Result<Flaky, Error> {
        Ok(self)
    }
}

#[tokio::test]
async fn a_mount_whose_receives_fail_is_reconnecting_until_one_succeeds_and_counts_one_reconnect() {
    // The runtime is current-thread: the app's tasks record here.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let down = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let app = App::new("flaky")
        .mount(
            Flaky {
                down: down.clone(),
                delivered: delivered.clone(),
                failed: failed.clone(),
                ..Flaky::default()
            },
            ignore,
            |m| m,
        )
        .start()
        .await
        .unwrap();
    assert!(app.health().is_ready());

    down.store(true, Ordering::SeqCst);
    let health = health_until(&app, "reconnecting", |h| {
        h.mounts[0].state == MountState::Reconnecting
    })
    .await;
    assert!(health.is_live() && !health.is_ready(), "{health:?}");
    // Several failed receives in a row: one outage, which counted a reconnect per receive.
    health_until(&app, "three receives failed", |_| {
        failed.load(Ordering::SeqCst) >= 3
    })
    .await;

    down.store(false, Ordering::SeqCst);
    // A receive succeeds again (ready shows between failed receives too).
    let before = delivered.load(Ordering::SeqCst);
    health_until(&app, "a delivery received again", |_| {
        delivered.load(Ordering::SeqCst) > before
    })
    .await;
    health_until(&app, "running again", Health::is_ready).await;
    app.shutdown().await.unwrap();
    // Receives failed in a row: one reconnect.
    let reconnects: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "conveyor.reconnects")
        .map(|(.., value)| value)
        .collect();
    assert_eq!(
        reconnects,
        [metrics_util::debugging::DebugValue::Counter(1)]
    );
}

#[tokio::test]
async fn a_mount_whose_subscription_ends_or_whose_task_panics_is_failed_and_the_app_not_live() {
    for (flaky, says) in [
        (
            Flaky {
                ends: true,
                ..Flaky::default()
            },
            "flaky",
        ),
        (
            Flaky {
                panics: true,
                ..Flaky::default()
            },
            "the mount's task panicked or was aborted",
        ),
    ] {
        let broker = MemoryBroker::new();
        let app = App::new("fails")
            .mount(broker.queue("fine"), ignore, |m| m)
            .mount(flaky, ignore, |m| m)
            .start()
            .await
            .unwrap();
        let health = health_until(&app, "failed", |h| !h.is_live()).await;
        assert_eq!(health.mounts[0].state, MountState::Running);
        let MountState::Failed(error) = &health.mounts[1].state else {
            panic!("{health:?}");
        };
        assert!(error.contains(says), "{error}");
        let _ = app.shutdown().await;
    }
}
