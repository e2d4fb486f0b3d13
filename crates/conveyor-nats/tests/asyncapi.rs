//! The AsyncAPI document of an app on NATS carries the NATS bindings and the partition
//! key's header.

mod common;

use conveyor::{App, Json};

async fn handle(Json(_): Json<u64>) {}

#[tokio::test]
async fn a_mounted_queue_is_described_with_its_nats_binding_and_key_header() {
    let broker = common::broker().await;
    let app =
        App::new("orders").mount(broker.queue("orders.eu").consumer("billing"), handle, |m| m);
    let document = app.asyncapi().into_json();
    let text = document.to_string();
    assert!(text.contains("\"nats\""), "{text}");
    assert!(text.contains("\"queue\":\"billing\""), "{text}");
    assert!(text.contains("\"bindingVersion\":\"0.1.0\""), "{text}");
    assert!(text.contains(conveyor_nats::PARTITION_KEY_HEADER), "{text}");
}
