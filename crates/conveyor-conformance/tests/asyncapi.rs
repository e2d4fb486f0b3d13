//! The AsyncAPI document of an app mounted on all three transports validates against the
//! official AsyncAPI 3.0.0 JSON Schema (vendored in `tests/asyncapi/`), and says what
//! the mounts do: channels, operations, content types, schemas, the partition key's
//! header, the brokers' bindings and Conveyor's own extension fields.

use std::time::Duration;

use conveyor::{App, Batch, Cbor, Json, MemoryBroker, Message, MsgPack};
use serde_json::{Value, json};

mod common;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
    /// Who placed it: the partition key too.
    #[allow(dead_code)]
    customer: String,
}

#[derive(serde::Serialize, schemars::JsonSchema)]
struct Invoice {
    order: u64,
    cents: u64,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Reading {
    #[allow(dead_code)]
    sensor: u32,
}

async fn bill(Json(order): Json<Order>) -> Result<Message, conveyor::Error> {
    Message::json(&Invoice {
        order: order.id,
        cents: 100,
    })
}

async fn record(MsgPack(_reading): MsgPack<Reading>) {}

async fn audit(_batch: Batch<Cbor<Reading>>) {}

fn schema() -> jsonschema::Validator {
    let text = include_str!("asyncapi/asyncapi-3.0.0.schema.json");
    let schema: Value = serde_json::from_str(text).expect("the vendored schema is JSON");
    jsonschema::validator_for(&schema).expect("the vendored schema compiles")
}

fn errors(validator: &jsonschema::Validator, document: &Value) -> Vec<String> {
    validator
        .iter_errors(document)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect()
}

#[tokio::test]
async fn the_document_of_an_app_on_every_transport_validates_and_describes_its_mounts() {
    let memory = MemoryBroker::new();
    let rabbitmq = common::rabbitmq("asyncapi").await;
    let sqs = common::sqs().await;
    let app = App::new("shop")
        .version("2.1.0")
        .mount(memory.queue("orders"), bill, |m| {
            m.workers(8)
                .by_key()
                .publish_to("invoices")
                .payload_schema::<Order>()
                .output_schema::<Invoice>()
        })
        .mount(rabbitmq.queue("readings"), record, |m| {
            m.reject_on_error()
                .timeout(Duration::from_secs(5))
                .payload_schema::<Reading>()
        })
        .mount(sqs.queue("audit.fifo"), audit, |m| {
            m.batch(10).max_attempts(3).payload_schema::<Reading>()
        });
    let document = app.asyncapi().into_json();

    let validator = schema();
    let found = errors(&validator, &document);
    assert!(found.is_empty(), "{found:#?}\n{document:#}");

    assert_eq!(document["asyncapi"], "3.0.0");
    assert_eq!(document["info"]["title"], "shop");
    assert_eq!(document["info"]["version"], "2.1.0");

    // In process: lanes, the key's header, the schemas, and the output's channel.
    let orders = &document["channels"]["orders"];
    assert_eq!(orders["address"], "orders");
    let order = &orders["messages"]["Order"];
    assert_eq!(order["contentType"], "application/json");
    assert_eq!(order["payload"]["$ref"], "#/components/schemas/Order");
    assert!(order["headers"]["properties"]["x-partition-key"].is_object());
    assert_eq!(
        order["correlationId"]["location"],
        "$message.header#/correlation-id"
    );
    let receive = &document["operations"]["receive_orders"];
    assert_eq!(receive["action"], "receive");
    assert_eq!(receive["channel"]["$ref"], "#/channels/orders");
    assert_eq!(
        receive["messages"][0]["$ref"],
        "#/channels/orders/messages/Order"
    );
    assert_eq!(
        receive["x-conveyor-dispatch"],
        json!({ "mode": "lanes", "lanes": 8, "orderedBy": "partition key" })
    );
    assert_eq!(
        receive["x-conveyor-failure-policy"],
        json!({
            "onError": "retry_after",
            "backoff": { "kind": "exponential", "baseMs": 1000, "maxMs": 60000 },
            "maxAttempts": 5,
        })
    );
    let send = &document["operations"]["send_invoices"];
    assert_eq!(send["action"], "send");
    assert_eq!(send["channel"]["$ref"], "#/channels/invoices");
    assert_eq!(send["x-conveyor-published-by"], "orders");
    assert_eq!(
        document["channels"]["invoices"]["messages"]["Invoice"]["payload"]["$ref"],
        "#/components/schemas/Invoice"
    );
    let schemas = &document["components"]["schemas"];
    assert_eq!(schemas["Order"]["properties"]["customer"]["type"], "string");
    assert_eq!(schemas["Invoice"]["required"], json!(["order", "cents"]));

    // RabbitMQ: AMQP bindings, MessagePack, the policy and the timeout.
    let readings = &document["channels"]["readings"];
    assert_eq!(
        readings["bindings"]["amqp"],
        json!({ "is": "queue", "queue": { "name": "readings" }, "bindingVersion": "0.3.0" })
    );
    let reading = &readings["messages"]["Reading"];
    assert_eq!(reading["contentType"], "application/msgpack");
    assert!(reading["headers"]["properties"]["amqp-partition-key"].is_object());
    let receive = &document["operations"]["receive_readings"];
    assert_eq!(receive["bindings"]["amqp"]["ack"], true);
    assert_eq!(
        receive["x-conveyor-dispatch"],
        json!({ "mode": "sequential" })
    );
    assert_eq!(
        receive["x-conveyor-failure-policy"],
        json!({ "onError": "reject", "maxAttempts": 5 })
    );
    assert_eq!(receive["x-conveyor-timeout-ms"], 5000);

    // SQS: a FIFO queue's bindings, the message group as the key, CBOR batches.
    let audit = &document["channels"]["audit.fifo"];
    assert_eq!(
        audit["bindings"]["sqs"]["queue"],
        json!({ "name": "audit.fifo", "fifoQueue": true })
    );
    let reading = &audit["messages"]["Reading"];
    assert_eq!(reading["contentType"], "application/cbor");
    assert!(reading["headers"]["properties"]["MessageGroupId"].is_object());
    let receive = &document["operations"]["receive_audit.fifo"];
    assert_eq!(
        receive["bindings"]["sqs"]["queues"][0]["name"],
        "audit.fifo"
    );
    assert_eq!(
        receive["x-conveyor-dispatch"],
        json!({ "mode": "batch", "size": 10 })
    );
    assert_eq!(receive["x-conveyor-failure-policy"]["maxAttempts"], 3);

    let _ = rabbitmq.close().await;
}

#[test]
fn the_schema_refuses_a_document_that_breaks_it() {
    // The validator is not vacuous: an operation without its channel, and a channel
    // binding that is no AMQP binding, are each refused.
    let broker = MemoryBroker::new();
    let app = App::new("shop").mount(broker.queue("orders"), bill, |m| m.publish_to("invoices"));
    let document = app.asyncapi().into_json();
    let validator = schema();
    assert!(errors(&validator, &document).is_empty());

    let mut broken = document.clone();
    if let Some(operation) = broken["operations"]["receive_orders"].as_object_mut() {
        operation.remove("channel");
    }
    assert!(!errors(&validator, &broken).is_empty());

    let mut broken = document;
    broken["channels"]["orders"]["bindings"] = json!({ "amqp": { "is": "exchange" } });
    assert!(!errors(&validator, &broken).is_empty());
}

/// Any JSON at all, under a name of its own: a type whose schema is the boolean `true`
/// and, being named, a `components.schemas` entry.
#[derive(serde::Deserialize)]
struct Anything(#[allow(dead_code)] Value);

impl schemars::JsonSchema for Anything {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Anything".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        true.into()
    }
}

/// A payload with fields of any JSON: the document's components hold the named schema
/// of `Anything`, and a property of `Envelope` is the boolean schema.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Envelope {
    #[allow(dead_code)]
    body: Anything,
    #[allow(dead_code)]
    extra: Value,
}

async fn take_any(Json(_any): Json<Value>) -> Message {
    Message::new("{}")
}

async fn take_envelope(Json(_envelope): Json<Envelope>) {}

#[test]
fn payloads_of_any_json_are_object_schemas_in_a_valid_document() {
    // schemars gives `serde_json::Value` the boolean schema `true`, which AsyncAPI
    // refuses as a message's payload or a components entry.
    let broker = MemoryBroker::new();
    let app = App::new("shop")
        .mount(broker.queue("events"), take_any, |m| {
            m.publish_to("echoes")
                .payload_schema::<Value>()
                .output_schema::<Value>()
        })
        .mount(broker.queue("envelopes"), take_envelope, |m| {
            m.payload_schema::<Envelope>()
        });
    let document = app.asyncapi().into_json();

    let found = errors(&schema(), &document);
    assert!(found.is_empty(), "{found:#?}\n{document:#}");
    let channels = &document["channels"];
    assert_eq!(
        channels["events"]["messages"]["Value"]["payload"],
        json!({})
    );
    assert_eq!(
        channels["echoes"]["messages"]["AnyValue"]["payload"],
        json!({})
    );
    assert_eq!(document["components"]["schemas"]["Anything"], json!({}));
    // Nested, a boolean schema is a valid Schema Object and stays as it is.
    assert_eq!(
        document["components"]["schemas"]["Envelope"]["properties"]["extra"],
        json!(true)
    );
}

#[tokio::test]
async fn queues_of_one_name_on_two_brokers_are_two_channels_with_their_own_bindings() {
    // In process: `orders`, publishing to `invoices`. On SQS: `invoices` (named like the
    // in-process destination), and `orders` (named like the in-process queue),
    // publishing to SQS's `invoices`.
    let memory = MemoryBroker::new();
    let sqs = common::sqs().await;
    let app = App::new("shop")
        .mount(memory.queue("orders"), bill, |m| m.publish_to("invoices"))
        .mount(sqs.queue("invoices"), take_any, |m| m)
        .mount(sqs.queue("orders"), bill, |m| m.publish_to("invoices"));
    let document = app.asyncapi().into_json();

    let found = errors(&schema(), &document);
    assert!(found.is_empty(), "{found:#?}\n{document:#}");
    let channels = document["channels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut ids: Vec<&str> = channels.keys().map(String::as_str).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["invoices", "invoices_2", "orders", "orders_2"],
        "{document:#}"
    );
    let operations = document["operations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(operations.len(), 5, "{document:#}");
    for (id, operation) in &operations {
        let reference = operation["channel"]["$ref"].as_str().unwrap_or_default();
        let channel = &channels[reference.trim_start_matches("#/channels/")];
        // An operation on SQS is on a channel with SQS's bindings; one in process is on
        // a channel with none.
        assert_eq!(
            operation["bindings"]["sqs"].is_object(),
            channel["bindings"]["sqs"].is_object(),
            "operation `{id}` is on {reference}: {document:#}"
        );
        assert_eq!(
            operation["bindings"].is_null(),
            channel["bindings"].is_null(),
            "operation `{id}` is on {reference}: {document:#}"
        );
    }
    // SQS's `orders` sends to SQS's `invoices`, the channel it receives from.
    assert_eq!(
        operations["send_invoices_2"]["channel"], operations["receive_invoices_2"]["channel"],
        "{document:#}"
    );
}

/// A destination sent to through `publish_via` (whose broker the document cannot know)
/// is the channel of the mounted queue of that name, whether that mount comes before or
/// after: one channel, on which the send and the receive meet. (It was a second channel,
/// `invoices_2`, without bindings.)
#[tokio::test]
async fn a_queue_sent_to_through_publish_via_and_consumed_is_one_channel() {
    let memory = MemoryBroker::new();
    let sqs = common::sqs().await;
    let sending = |app: App| {
        app.mount(memory.queue("orders"), bill, |m| {
            m.publish_to("invoices").publish_via(sqs.clone())
        })
    };
    let consuming = |app: App| app.mount(sqs.queue("invoices"), take_any, |m| m);
    for app in [
        consuming(sending(App::new("shop"))),
        sending(consuming(App::new("shop"))),
    ] {
        let document = app.asyncapi().into_json();
        let found = errors(&schema(), &document);
        assert!(found.is_empty(), "{found:#?}\n{document:#}");
        let mut ids: Vec<&str> = document["channels"]
            .as_object()
            .map(|channels| channels.keys().map(String::as_str).collect())
            .unwrap_or_default();
        ids.sort_unstable();
        assert_eq!(ids, ["invoices", "orders"], "{document:#}");
        let invoices = &document["channels"]["invoices"];
        assert!(invoices["bindings"]["sqs"].is_object(), "{document:#}");
        assert_eq!(
            document["operations"]["send_invoices"]["channel"],
            document["operations"]["receive_invoices"]["channel"],
            "{document:#}"
        );
    }
}
