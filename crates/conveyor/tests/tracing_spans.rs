//! Each delivery is handled inside a span named and attributed after OpenTelemetry's
//! messaging conventions, and the handler's own events nest under it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use conveyor::testing::TestApp;
use conveyor::{App, Json, MemoryBroker, Message};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span as the layer saw it: its name and fields.
#[derive(Clone, Debug, Default)]
struct Seen {
    name: String,
    fields: BTreeMap<String, String>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            format!("{value:?}").trim_matches('"').to_string(),
        );
    }
}

/// An event's message, and the span it happened in.
type Happened = (String, Option<Seen>);

/// Keeps every span's fields, and for every event the span it happened in.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<BTreeMap<u64, Seen>>>,
    events: Arc<Mutex<Vec<Happened>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().to_string(),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.spans.lock().unwrap().insert(id.into_u64(), seen);
    }

    fn on_event(&self, event: &Event<'_>, cx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let span = cx.event_span(event).and_then(|span| {
            self.spans
                .lock()
                .unwrap()
                .get(&span.id().into_u64())
                .cloned()
        });
        self.events.lock().unwrap().push((message, span));
    }
}

async fn greet(Json(name): Json<String>) {
    tracing::info!("hello {name}");
}

#[test]
fn the_handler_runs_inside_a_span_with_the_messaging_attributes() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let broker = MemoryBroker::new();
        let app =
            App::new("spans").mount(broker.queue("greetings"), greet, |m| m.workers(2).by_key());
        let test = TestApp::start(app, &broker).await.unwrap();
        let message = Message::builder()
            .message_id("m-1")
            .partition_key("alice")
            .json(&"alice")
            .unwrap();
        test.publish("greetings", message).await.unwrap();
        test.settled().await.unwrap();
        test.stop().await.unwrap();
    });

    let events = capture.events.lock().unwrap().clone();
    let (_, span) = events
        .iter()
        .find(|(message, _)| message == "hello alice")
        .expect("the handler's event");
    let span = span.clone().expect("the handler's event is inside a span");
    assert_eq!(span.name, "conveyor.process");
    let field = |name: &str| span.fields.get(name).map(String::as_str);
    assert_eq!(field("messaging.system"), Some("conveyor_in_process"));
    assert_eq!(field("messaging.destination.name"), Some("greetings"));
    assert_eq!(field("messaging.operation.type"), Some("process"));
    assert_eq!(field("messaging.message.id"), Some("m-1"));
    assert_eq!(field("messaging.conveyor.attempt"), Some("1"));
    assert_eq!(
        field("messaging.conveyor.lane"),
        Some(
            conveyor::dispatch::lane_for_key("alice", 2)
                .to_string()
                .as_str()
        )
    );
    assert_eq!(field("messaging.conveyor.dispatch"), Some("lanes"));
}
