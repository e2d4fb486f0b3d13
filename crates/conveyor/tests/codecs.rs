//! MessagePack and CBOR payloads on the in-process transport: a handler decodes the
//! format it names, a delivery labelled with another format is rejected with both named,
//! and a mount that takes any content type decodes whatever the label.

use std::sync::{Arc, Mutex};

use conveyor::testing::TestApp;
use conveyor::{App, Batch, Cbor, MemoryBroker, Message, MsgPack, State};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Reading {
    sensor: u32,
    celsius: f64,
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Reading>>>);

impl Seen {
    fn all(&self) -> Vec<Reading> {
        self.0.lock().unwrap().clone()
    }
}

async fn msgpack(MsgPack(reading): MsgPack<Reading>, State(seen): State<Seen>) {
    seen.0.lock().unwrap().push(reading);
}

async fn cbor(Cbor(reading): Cbor<Reading>, State(seen): State<Seen>) {
    seen.0.lock().unwrap().push(reading);
}

async fn cbor_batch(batch: Batch<Cbor<Reading>>, State(seen): State<Seen>) {
    let mut seen = seen.0.lock().unwrap();
    seen.extend(batch.into_iter().map(|Cbor(reading)| reading));
}

fn reading(sensor: u32) -> Reading {
    Reading {
        sensor,
        celsius: 20.5,
    }
}

#[tokio::test]
async fn each_format_decodes_what_its_publisher_encoded() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("codecs")
        .with_state(seen.clone())
        .mount(broker.queue("packed"), msgpack, |m| m)
        .mount(broker.queue("cbor"), cbor, |m| m)
        .mount(broker.queue("cbor-batches"), cbor_batch, |m| m.batch(4));
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish("packed", Message::msgpack(&reading(1)).unwrap())
        .await
        .unwrap();
    test.publish("cbor", Message::cbor(&reading(2)).unwrap())
        .await
        .unwrap();
    test.publish("cbor-batches", Message::cbor(&reading(3)).unwrap())
        .await
        .unwrap();
    test.settled().await.unwrap();
    let mut all = seen.all();
    all.sort_by_key(|r| r.sensor);
    assert_eq!(all, [reading(1), reading(2), reading(3)]);
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_delivery_labelled_with_another_format_is_rejected_naming_both() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("codecs")
        .with_state(seen.clone())
        .mount(broker.queue("packed"), msgpack, |m| m)
        .mount(broker.queue("cbor-batches"), cbor_batch, |m| m.batch(4));
    let test = TestApp::start(app, &broker).await.unwrap();
    // Valid MessagePack, labelled JSON: rejected before decoding.
    let mislabelled = Message::builder()
        .content_type("application/json")
        .msgpack(&reading(1))
        .unwrap();
    test.publish("packed", mislabelled).await.unwrap();
    test.publish("cbor-batches", Message::json(&reading(2)).unwrap())
        .await
        .unwrap();
    test.settled().await.unwrap();
    assert!(seen.all().is_empty());
    let dead = test.rejected("packed");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].reason,
        "cannot decode payload as msgpack: its content type is `application/json`, and msgpack reads application/msgpack, application/x-msgpack, application/vnd.msgpack"
    );
    let dead = test.rejected("cbor-batches");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0]
            .reason
            .contains("content type is `application/json`, and cbor reads application/cbor"),
        "{}",
        dead[0].reason
    );
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_mount_that_takes_any_content_type_decodes_whatever_the_label() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app =
        App::new("codecs")
            .with_state(seen.clone())
            .mount(broker.queue("packed"), msgpack, |m| m.any_content_type());
    let test = TestApp::start(app, &broker).await.unwrap();
    let octets = Message::builder()
        .content_type("application/octet-stream")
        .msgpack(&reading(1))
        .unwrap();
    test.publish("packed", octets).await.unwrap();
    test.settled().await.unwrap();
    assert_eq!(seen.all(), [reading(1)]);
    assert!(test.rejected("packed").is_empty());
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_delivery_with_no_content_type_is_decoded_and_a_bad_one_rejected_as_undecodable() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("codecs")
        .with_state(seen.clone())
        .mount(broker.queue("cbor"), cbor, |m| m);
    let test = TestApp::start(app, &broker).await.unwrap();
    let mut bare = Vec::new();
    ciborium::into_writer(&reading(4), &mut bare).unwrap();
    test.publish("cbor", Message::new(bare)).await.unwrap();
    test.publish("cbor", Message::new(&b"\xff\xff"[..]))
        .await
        .unwrap();
    test.settled().await.unwrap();
    assert_eq!(seen.all(), [reading(4)]);
    let dead = test.rejected("cbor");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0]
            .reason
            .starts_with("cannot decode payload as cbor: "),
        "{}",
        dead[0].reason
    );
    test.stop().await.unwrap();
}
