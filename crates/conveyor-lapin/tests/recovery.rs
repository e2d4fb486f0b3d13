//! Connections killed mid-stream: subscriptions resume by themselves and nothing is lost.
//!
//! The test kills its own connections from the server's side (`rabbitmqctl
//! close_connection`, as `close_all_connections` would, but sparing every other client
//! of the broker), while deliveries are in flight on them.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use conveyor::{App, DeliveryInfo, Json, Message, Outcome, QueueSpec, State};
use conveyor_lapin::{LapinPublisher, RabbitQueueSpec};

use common::{
    Seen, broker_named, cleanup, close_connections_named, publish_confirmed, publish_one, ready,
    record, unique, wait_until,
};

/// Holds handlers of messages from 300 on until the connections have been killed, so
/// that deliveries are in flight on the channel that dies.
#[derive(Clone)]
struct Gate(tokio::sync::watch::Receiver<bool>);

async fn record_gated(
    Json(id): Json<u32>,
    State(seen): State<Seen<u32>>,
    State(gate): State<Gate>,
) {
    if id >= 300 {
        let _ = gate.0.clone().wait_for(|open| *open).await;
    }
    seen.push(id);
}

/// Publishes `ids`, each retried until the broker confirms it, keyed over 20 keys.
async fn publish_keyed(publisher: &LapinPublisher, queue: &str, ids: std::ops::Range<u32>) {
    for id in ids {
        let message = Message::builder()
            .partition_key(format!("k{}", id % 20))
            .json(&id)
            .unwrap();
        publish_confirmed(publisher, queue, message).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_resume_and_lose_nothing() {
    let name = unique("recovery-connection");
    let broker = broker_named(&name).await;
    let queue = unique("recovery");
    let seen = Seen::<u32>::default();
    let (open, gate) = tokio::sync::watch::channel(false);
    let running = App::new("recovery")
        .with_state(seen.clone())
        .with_state(Gate(gate))
        .mount(broker.queue(queue.as_str()), record_gated, |m| {
            m.workers(4).by_key()
        })
        .start()
        .await
        .unwrap();

    let publisher_broker = broker_named(&name).await;
    let publisher = publisher_broker.publisher().await.unwrap();
    let publishing = {
        let (publisher, queue) = (publisher.clone(), queue.clone());
        tokio::spawn(async move { publish_keyed(&publisher, &queue, 0..2000).await })
    };
    wait_until("the first 300 messages to be handled", || seen.len() >= 300).await;

    assert_eq!(
        close_connections_named(&name),
        4,
        "both brokers' connections closed (each consumes on one and publishes on another)"
    );
    open.send_replace(true);

    publishing.await.unwrap();
    wait_until(
        "every message to be handled after the connection loss",
        || {
            let handled: HashSet<u32> = seen.all().into_iter().collect();
            (0..2000).all(|id| handled.contains(&id))
        },
    )
    .await;
    let all = seen.all();
    let unique_ids: HashSet<u32> = all.iter().copied().collect();
    assert!(
        all.len() > unique_ids.len(),
        "deliveries in flight on the dead channel come again"
    );

    // And the subscription keeps going on the recovered connection.
    publish_keyed(&publisher, &queue, 2000..2010).await;
    wait_until("messages after recovery to be handled", || {
        let handled: HashSet<u32> = seen.all().into_iter().collect();
        (2000..2010).all(|id| handled.contains(&id))
    })
    .await;

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_with_the_connection_is_declared_again() {
    let name = unique("recovery-topology");
    let broker = broker_named(&name).await;
    let queue = unique("recovery-exclusive");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).durable(false).exclusive())
        .await
        .unwrap();
    // Mounted by name: the subscription knows the declaration this broker made, and
    // makes it again on its own channel, so that recovery brings the queue back. The
    // exclusive queue goes with its connection; recovery declares it again and resumes
    // the consumer on it.
    let running = consumes_across_a_kill(&broker, &name, &queue).await;
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

/// Mounts a handler on `queue` of `broker` (whose connections are named `name`), sees a
/// message arrive, closes both connections, and sees one arrive again after recovery.
async fn consumes_across_a_kill(
    broker: &conveyor_lapin::LapinBroker,
    name: &str,
    queue: &str,
) -> conveyor::RunningApp {
    let seen = Seen::<u32>::default();
    let running = App::new("recovery")
        .with_state(seen.clone())
        .mount(broker.queue(queue), record, |m| m)
        .start()
        .await
        .unwrap();
    let publisher_broker = common::broker().await;
    let publisher = publisher_broker.publisher().await.unwrap();
    publish_keyed(&publisher, queue, 0..1).await;
    wait_until("the first message", || seen.len() == 1).await;

    assert_eq!(close_connections_named(name), 2);
    let publisher = &publisher;
    publish_until_one_arrives(&seen, |id| async move {
        publish_keyed(publisher, queue, id..id + 1).await;
        true
    })
    .await;
    running
}

/// A binding, and the exclusive queue it binds, come back after a lost connection even
/// when the broker refused a declaration before: that closed the topology channel the
/// binding was declared on, and lapin declares again only what a channel itself
/// declared, so the new topology channel brought back nothing of the old one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_comes_back_after_a_refused_declaration_and_a_lost_connection() {
    use conveyor_lapin::{Binding, ExchangeSpec, ExchangeType, LapinError, PublishOptions};

    let name = unique("recovery-binding");
    let broker = broker_named(&name).await;
    let (exchange, queue, other) = (
        unique("recovery-events"),
        unique("recovery-bound"),
        unique("recovery-other"),
    );
    broker
        .declare_exchange(
            &ExchangeSpec::new(exchange.as_str(), ExchangeType::Fanout).durable(false),
        )
        .await
        .unwrap();
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).durable(false).exclusive())
        .await
        .unwrap();
    broker
        .bind(&Binding::new(queue.as_str(), exchange.as_str(), ""))
        .await
        .unwrap();
    // A queue bound too, which another client then declares otherwise: declaring it
    // again as recorded is refused, and the declarations made again before that
    // refusal must not be lost with the channel it closes.
    // (On an exchange of its own: bound to the first, it would take the messages the
    // test publishes there to see whether the exclusive queue is bound again.)
    let (changed, elsewhere) = (unique("recovery-changed"), unique("recovery-elsewhere"));
    broker
        .declare_exchange(
            &ExchangeSpec::new(elsewhere.as_str(), ExchangeType::Fanout).durable(false),
        )
        .await
        .unwrap();
    broker
        .declare_queue(&QueueSpec::new(changed.as_str()))
        .await
        .unwrap();
    broker
        .bind(&Binding::new(changed.as_str(), elsewhere.as_str(), ""))
        .await
        .unwrap();
    let admin = common::broker().await;
    admin.delete_queue(&changed).await.unwrap();
    admin
        .declare_queue(&QueueSpec::new(changed.as_str()).durable(false))
        .await
        .unwrap();
    // Declared again with other settings: the broker refuses (PRECONDITION_FAILED) and
    // closes the topology channel.
    broker
        .declare_queue(&QueueSpec::new(other.as_str()))
        .await
        .unwrap();
    let refused = broker
        .declare_queue(&QueueSpec::new(other.as_str()).durable(false))
        .await;
    assert!(refused.is_err(), "{refused:?}");

    let seen = Seen::<u32>::default();
    let running = App::new("recovery-binding")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record, |m| m)
        .start()
        .await
        .unwrap();
    let publisher_broker = common::broker().await;
    let publisher = publisher_broker.publisher().await.unwrap();
    let publish = |id: u32| {
        publisher.publish_to(
            &exchange,
            "",
            Message::json(&id).unwrap(),
            PublishOptions::default(),
        )
    };
    publish(0).await.unwrap();
    wait_until("the first message", || seen.len() == 1).await;

    // The exclusive queue, and its binding, go with the connection.
    assert_eq!(close_connections_named(&name), 2);
    publish_until_one_arrives(&seen, |id| {
        let publish = &publish;
        async move {
            match publish(id).await {
                Ok(()) => true,
                // Unroutable until recovery has bound the queue again.
                Err(LapinError::Returned { .. }) => false,
                Err(error) => panic!("{error}"),
            }
        }
    })
    .await;

    running.shutdown().await.unwrap();
    cleanup(
        &broker,
        &[&queue, &other, &changed],
        &[&exchange, &elsewhere],
    )
    .await;
}

/// A lost connection recovers after an exchange with a binding was deleted. lapin
/// forgets the exchange but not the binding, and declares it again on recovery: the
/// broker refuses (NOT_FOUND) and closes the topology channel, and only that channel;
/// the subscription resumes, and the next declaration opens a new topology channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_recovers_after_an_exchange_with_a_binding_was_deleted() {
    use conveyor_lapin::{Binding, ExchangeSpec, ExchangeType};

    let name = unique("recovery-deleted-exchange");
    let broker = broker_named(&name).await;
    let (exchange, bound, queue) = (
        unique("recovery-gone"),
        unique("recovery-was-bound"),
        unique("recovery-after"),
    );
    broker
        .declare_exchange(&ExchangeSpec::new(exchange.as_str(), ExchangeType::Fanout))
        .await
        .unwrap();
    for queue in [&bound, &queue] {
        broker
            .declare_queue(&QueueSpec::new(queue.as_str()))
            .await
            .unwrap();
    }
    broker
        .bind(&Binding::new(bound.as_str(), exchange.as_str(), ""))
        .await
        .unwrap();
    broker.delete_exchange(&exchange).await.unwrap();

    let running = consumes_across_a_kill(&broker, &name, &queue).await;
    // And the broker still declares: its topology channel came back too. The broker's
    // own connection was cut as well and may still be reconnecting when the subscription
    // has resumed (a declaration then fails at once, as the connection is not up yet), so
    // the test waits for a declaration to succeed, up to the deadline.
    let later = unique("recovery-later");
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    while let Err(error) = broker.declare_queue(&QueueSpec::new(later.as_str())).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broker never declared again: {error}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&bound, &queue, &later], &[]).await;
}

/// After a kill, publishes ids from 1 on with `publish` (which says whether the broker
/// routed the message) until one arrives in `seen`, for at most [`common::DEADLINE`].
/// One probe is not enough: a message routed in the moment between the kill and the
/// broker's deletion of the connection's exclusive queue goes down with that queue.
async fn publish_until_one_arrives<F, Fut>(seen: &Seen<u32>, mut publish: F)
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    let arrived = || seen.all().iter().any(|&id| id >= 1);
    let mut id = 1;
    while !arrived() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no message published after the kill arrived ({} routed)",
            id - 1
        );
        if publish(id).await {
            id += 1;
            // Given a while to arrive before the next probe.
            let until = tokio::time::Instant::now() + Duration::from_secs(2);
            while !arrived() && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What the first handler run returns, after the connection it came on is gone.
#[derive(Clone, Copy)]
struct Late(Outcome);

/// Holds the first delivery until the gate opens, then settles it as [`Late`] says;
/// acks every later one.
async fn hold_the_first(
    _: Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<u32>>,
    State(gate): State<Gate>,
    State(late): State<Late>,
) -> Outcome {
    let first = seen.len() == 0;
    seen.push(info.attempt);
    if first {
        let _ = gate.0.clone().wait_for(|open| *open).await;
        late.0
    } else {
        Outcome::Ack
    }
}

/// A delivery whose connection died while its handler ran is settled with `late`: the
/// broker delivers the original again after recovery, so the settlement must make no
/// copy of it (the retry-after's in the delay queue, the dead letter in the dead-letter
/// queue, the retry's in the queue itself): the message is handled twice, first on the
/// dead connection, then once again, and no copy is left anywhere.
async fn settle_after_the_connection_died(late: Outcome) {
    let name = unique("late-settle-connection");
    let broker = broker_named(&name).await;
    let queue = unique("late-settle");
    let dlq = unique("late-settle-dead");
    let publishing = common::broker().await;
    publishing
        .declare_queue(&QueueSpec::new(dlq.as_str()))
        .await
        .unwrap();
    let seen = Seen::<u32>::default();
    let (open, gate) = tokio::sync::watch::channel(false);
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).dead_letter_queue(dlq.as_str(), 10))
        .await
        .unwrap();
    // Workers hand retries to the broker (a sequential mount would retry in place).
    let running = App::new("late-settle")
        .with_state(seen.clone())
        .with_state(Gate(gate))
        .with_state(Late(late))
        .mount(broker.queue(&queue), hold_the_first, |m| m.workers(2))
        .start()
        .await
        .unwrap();
    publish_one(&publishing, &queue, 1).await;
    wait_until("the first delivery in its handler", || seen.len() == 1).await;

    assert_eq!(close_connections_named(&name), 2);
    // The redelivery comes on the recovered channel: by then the first delivery's
    // channel is known to be dead.
    wait_until("the redelivery after recovery", || seen.len() == 2).await;
    open.send_replace(true);
    running.shutdown().await.unwrap();

    assert_eq!(
        seen.all(),
        vec![1, 2],
        "handled on the dead channel, then once more"
    );
    let delay_queue = format!("{queue}.delay");
    for copies in [&queue, &delay_queue, &dlq] {
        assert_eq!(
            ready(&publishing, copies).await,
            0,
            "no copy of the message in `{copies}`"
        );
    }
    cleanup(&publishing, &[&queue, &dlq], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_on_a_dead_channel_makes_no_copy() {
    settle_after_the_connection_died(Outcome::RetryAfter(Duration::from_secs(600))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_on_a_dead_channel_makes_no_dead_letter() {
    settle_after_the_connection_died(Outcome::Reject).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_a_dead_channel_makes_no_copy() {
    settle_after_the_connection_died(Outcome::Retry).await;
}
