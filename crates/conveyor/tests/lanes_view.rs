//! `RunningApp::lanes` (and `TestApp::lanes`): what each lane runs and holds, the hot
//! keys, and the dispatcher's waits for a full lane, under a hot key.

use std::sync::Arc;
use std::time::Duration;

use conveyor::testing::TestApp;
use conveyor::{App, MemoryBroker, Message, MountLanes, PartitionKey, State};
use tokio::sync::Semaphore;

/// Holds the hot key's deliveries until the test lets them go.
#[derive(Clone)]
struct Gate(Arc<Semaphore>);

async fn handle(_payload: conveyor::Bytes, key: PartitionKey, State(gate): State<Gate>) {
    if key.as_str() == "hot" {
        let _ = gate.0.acquire().await.map(|permit| permit.forget());
    }
}

const LANES: usize = 4;
const HOT: usize = 200;

/// Waits, for at most a minute, until `check` holds for the mount's lanes.
async fn view_until(test: &TestApp, what: &str, check: impl Fn(&MountLanes) -> bool) -> MountLanes {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let view = test.lanes().remove(0);
        if check(&view) {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the lanes are {view:#?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Publishes `2 * HOT` messages: the hot key every other one, 50 others sharing the rest.
async fn publish_hot_and_cold(test: &TestApp) {
    for i in 0..HOT * 2 {
        let key = if i % 2 == 0 {
            "hot".to_string()
        } else {
            format!("cold-{}", i % 50)
        };
        let message = Message::builder().partition_key(key).payload("x");
        test.publish("orders", message).await.unwrap();
    }
}

#[tokio::test]
async fn the_lanes_view_shows_a_hot_key_holding_its_lane_and_the_mount() {
    let broker = MemoryBroker::new();
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let app = App::new("hot")
        .with_state(gate.clone())
        .mount(broker.queue("orders"), handle, |m| {
            m.workers(LANES).by_key()
        });
    let test = TestApp::start(app, &broker).await.unwrap();
    publish_hot_and_cold(&test).await;
    let hot_lane = conveyor::dispatch::lane_for_key("hot", LANES);

    // The hot key's first delivery runs and holds; one more waits in its lane, and the
    // dispatcher holds the next one for it, so the whole mount waits.
    let held = view_until(&test, "the hot lane full", |view| {
        let lane = &view.lanes[hot_lane];
        let others_idle = view
            .lanes
            .iter()
            .filter(|lane| lane.lane != hot_lane)
            .all(|lane| lane.waiting == 0 && lane.running_for.is_none());
        lane.running_for.is_some() && lane.waiting == 2 && view.full_lane_waits >= 1 && others_idle
    })
    .await;
    assert_eq!(held.queue, "orders");
    assert_eq!(held.lanes.len(), LANES);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let later = test.lanes().remove(0);
    assert!(
        later.lanes[hot_lane].running_for > held.lanes[hot_lane].running_for,
        "the running delivery ages: {later:#?}"
    );

    gate.0.add_permits(HOT);
    test.settled().await.unwrap();
    let done = view_until(&test, "every delivery handled", |view| {
        view.lanes.iter().map(|lane| lane.handled).sum::<u64>() == (HOT * 2) as u64
    })
    .await;
    assert!(
        done.lanes
            .iter()
            .all(|lane| lane.running_for.is_none() && lane.waiting == 0)
    );
    assert!(done.lanes[hot_lane].handled >= HOT as u64, "{done:#?}");
    let hottest = &done.hot_keys[0];
    assert_eq!(
        (hottest.key.as_str(), hottest.lane),
        ("hot", Some(hot_lane)),
        "{done:#?}"
    );
    assert_eq!(done.held, 0, "lanes hold nothing apart from their lanes");
    assert!(done.hot_keys.len() <= conveyor::lanes_view::HOT_KEY_SLOTS);
    assert!(done.full_lane_waits >= 1);
    test.stop().await.unwrap();
}

#[tokio::test]
async fn the_view_of_an_any_worker_mount_shows_the_deliveries_a_hot_key_holds() {
    const WORKERS: usize = 4;
    const READ_AHEAD: usize = 16;
    let broker = MemoryBroker::new();
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let app = App::new("hot")
        .with_state(gate.clone())
        .mount(broker.queue("orders"), handle, |m| {
            m.workers(WORKERS)
                .by_key()
                .any_worker()
                .read_ahead(READ_AHEAD)
        });
    let test = TestApp::start(app, &broker).await.unwrap();
    publish_hot_and_cold(&test).await;

    // The hot key runs on one worker and may hold `read_ahead - workers` more; the
    // mount then waits for it, with the other workers idle.
    let held = view_until(&test, "the hot key holding all it may", |view| {
        let running = view
            .lanes
            .iter()
            .filter(|l| l.running_for.is_some())
            .count();
        view.held == READ_AHEAD - WORKERS && running == 1 && view.full_lane_waits >= 1
    })
    .await;
    assert_eq!(held.lanes.len(), WORKERS);
    assert!(held.lanes.iter().all(|lane| lane.waiting == 0), "{held:#?}");

    gate.0.add_permits(HOT);
    test.settled().await.unwrap();
    let done = view_until(&test, "every delivery handled", |view| {
        view.lanes.iter().map(|lane| lane.handled).sum::<u64>() == (HOT * 2) as u64
    })
    .await;
    assert_eq!(done.held, 0);
    let hottest = &done.hot_keys[0];
    assert_eq!(
        (hottest.key.as_str(), hottest.lane),
        ("hot", None),
        "{done:#?}"
    );
    test.stop().await.unwrap();
}

#[tokio::test]
async fn only_keyed_mounts_are_in_the_lanes_view() {
    let broker = MemoryBroker::new();
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let app = App::new("mixed")
        .with_state(gate)
        .mount(broker.queue("a"), handle, |m| m)
        .mount(broker.queue("b"), handle, |m| m.workers(2).by_key())
        .mount(broker.queue("c"), handle, |m| m.workers(2))
        .mount(broker.queue("d"), handle, |m| {
            m.workers(3).by_key().any_worker()
        });
    let test = TestApp::start(app, &broker).await.unwrap();
    let view = test.lanes();
    let mounts: Vec<_> = view
        .iter()
        .map(|m| (m.queue.as_str(), m.lanes.len()))
        .collect();
    assert_eq!(mounts, [("b", 2), ("d", 3)]);
    assert!(view.iter().all(|m| m.hot_keys.is_empty()));
    test.stop().await.unwrap();
}
