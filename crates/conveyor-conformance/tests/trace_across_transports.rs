//! One trace through every transport (`otel` feature): a publish on RabbitMQ, whose
//! handler publishes to SQS, whose handler publishes in process, whose handler ends it.
//! Every span shares the trace id, and each one's parent is the span before it.
//!
//! Needs RabbitMQ on 127.0.0.1:5672 and the SQS emulator on 127.0.0.1:4566
//! (`scripts/services/`).

mod common;

use std::time::Duration;

use conveyor::{App, Broker, Json, MemoryBroker, Publisher, QueueSpec, State};
use conveyor_sqs::SqsBroker;
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio::sync::mpsc;
use tracing::Instrument;
use tracing_subscriber::layer::{Layer as _, SubscriberExt};

/// Where each stage publishes next.
#[derive(Clone)]
struct Route {
    sqs: SqsBroker,
    sqs_queue: String,
    memory: MemoryBroker,
    memory_queue: String,
    done: mpsc::UnboundedSender<u64>,
}

async fn from_rabbitmq(
    Json(n): Json<u64>,
    State(route): State<Route>,
) -> Result<(), conveyor::Error> {
    route.sqs.publish_json(&route.sqs_queue, &n).await
}

async fn from_sqs(Json(n): Json<u64>, State(route): State<Route>) -> Result<(), conveyor::Error> {
    route.memory.publish_json(&route.memory_queue, &n).await
}

async fn in_process(Json(n): Json<u64>, State(route): State<Route>) {
    let _ = route.done.send(n);
}

fn unique(name: &str) -> String {
    common::unique("trace", name)
}

/// The one span named `name`.
fn span<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(
        found.len(),
        1,
        "one span `{name}` among {:#?}",
        names(spans)
    );
    found[0]
}

fn names(spans: &[SpanData]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_ref()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_rabbitmq_through_sqs_to_the_in_process_transport() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("conformance")))
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(tracing_subscriber::EnvFilter::new("warn")),
        );
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let rabbitmq = common::rabbitmq("conveyor-trace-test").await;
    let sqs = common::sqs().await;
    let memory = MemoryBroker::new();
    let (rabbitmq_queue, sqs_queue, memory_queue) =
        (unique("rabbitmq"), unique("sqs"), unique("memory"));
    rabbitmq
        .declare_queue(&QueueSpec::new(&rabbitmq_queue))
        .await
        .unwrap();
    sqs.declare_queue(&QueueSpec::new(&sqs_queue))
        .await
        .unwrap();

    let (done, mut finished) = mpsc::unbounded_channel();
    let route = Route {
        sqs: sqs.clone(),
        sqs_queue: sqs_queue.clone(),
        memory: memory.clone(),
        memory_queue: memory_queue.clone(),
        done,
    };
    let app = App::new("trace")
        .with_state(route)
        .mount(rabbitmq.queue(&rabbitmq_queue), from_rabbitmq, |m| m)
        .mount(sqs.queue(&sqs_queue), from_sqs, |m| m)
        .mount(memory.queue(&memory_queue), in_process, |m| m)
        .start()
        .await
        .unwrap();

    let root = tracing::info_span!("test.root");
    rabbitmq
        .publish_json(&rabbitmq_queue, &7u64)
        .instrument(root.clone())
        .await
        .unwrap();
    let handled = tokio::time::timeout(Duration::from_secs(60), finished.recv()).await;
    assert_eq!(
        handled.expect("the last handler ran within a minute"),
        Some(7)
    );
    app.shutdown().await.unwrap();
    drop(root);
    rabbitmq.delete_queue(&rabbitmq_queue).await.unwrap();
    sqs.delete_queue(&sqs_queue).await.unwrap();
    rabbitmq.close().await.unwrap();
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let root = span(&spans, "test.root");
    let chain = [
        (format!("send {rabbitmq_queue}"), SpanKind::Producer),
        (format!("process {rabbitmq_queue}"), SpanKind::Consumer),
        (format!("send {sqs_queue}"), SpanKind::Producer),
        (format!("process {sqs_queue}"), SpanKind::Consumer),
        (format!("send {memory_queue}"), SpanKind::Producer),
        (format!("process {memory_queue}"), SpanKind::Consumer),
    ];
    let trace_id = root.span_context.trace_id();
    let mut parent = root;
    for (name, kind) in &chain {
        let step = span(&spans, name);
        assert_eq!(
            step.span_context.trace_id(),
            trace_id,
            "`{name}` is in the trace"
        );
        assert_eq!(
            step.parent_span_id,
            parent.span_context.span_id(),
            "`{name}`'s parent is `{}`",
            parent.name
        );
        assert_eq!(&step.span_kind, kind, "`{name}`'s kind");
        parent = step;
    }
    let consumed = span(&spans, &format!("process {sqs_queue}"));
    let system = consumed
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == "messaging.system")
        .map(|kv| kv.value.to_string());
    assert_eq!(system.as_deref(), Some("aws_sqs"));
}
