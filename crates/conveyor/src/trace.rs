//! Spans for publishing and processing, and the trace context that links them across
//! services.
//!
//! Every publish runs in a `conveyor.publish` span and every delivery's handler in a
//! `conveyor.process` span, named and attributed after OpenTelemetry's messaging
//! conventions (`messaging.system`, `messaging.destination.name`,
//! `messaging.operation.type`, ...). They are [`tracing`] spans: any subscriber shows
//! them, and they cost next to nothing when none wants them.
//!
//! With the `otel` cargo feature, Conveyor also carries the trace across services: a
//! publish writes its span's [W3C trace context] into the message's
//! [`TRACEPARENT_HEADER`] and [`TRACESTATE_HEADER`] headers on every transport, and a
//! delivery's span continues the trace those headers name. It reads the span's
//! OpenTelemetry context through [`tracing-opentelemetry`], so install its layer with
//! your exporter:
//!
//! ```ignore
//! use opentelemetry::trace::TracerProvider as _;
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
//!     .with_batch_exporter(exporter) // OTLP, Jaeger, stdout...
//!     .build();
//! let subscriber = tracing_subscriber::registry()
//!     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("orders")));
//! tracing::subscriber::set_global_default(subscriber)?;
//! ```
//!
//! Without the feature nothing of OpenTelemetry is compiled, and no header is added.
//!
//! On SQS the two headers are message attributes, so they count in its limit of ten per
//! message: with `otel`, a message has eight left for its own headers and properties
//! (nine when the trace state is empty, as it usually is).
//!
//! [W3C trace context]: https://www.w3.org/TR/trace-context/
//! [`tracing-opentelemetry`]: https://docs.rs/tracing-opentelemetry

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tracing::Span;

use crate::headers::Headers;

/// The header that carries the W3C `traceparent`: the trace id, the publishing span's
/// id and the sampling flag.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The header that carries the W3C `tracestate`, when the trace has one.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// For transports: the span one publish (or one batch) runs in. Made only when a
/// subscriber wants INFO spans of this crate.
pub fn publish_span(system: &'static str, destination: &str) -> Span {
    tracing::info_span!(
        "conveyor.publish",
        otel.name = %format_args!("send {destination}"),
        otel.kind = "producer",
        messaging.system = system,
        messaging.destination.name = destination,
        messaging.operation.type = "send",
    )
}

/// For transports: writes `span`'s trace context into `headers`, just before the
/// message is sent. Does nothing without the `otel` feature, for a span no subscriber
/// records, and for a message whose headers already carry a `traceparent` (its
/// publisher chose the trace).
pub fn inject_context(span: &Span, headers: &mut Headers) {
    #[cfg(feature = "otel")]
    otel::inject(span, headers);
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

pin_project_lite::pin_project! {
    /// Runs a future inside a span, as `tracing`'s `Instrumented` does, but drops a
    /// future that has finished without entering the span again: `Instrumented` enters
    /// it on drop every time, one more enter and exit per delivery (about 150
    /// instructions with a `tracing` registry). A future dropped before it finishes (a
    /// handler cancelled at the shutdown timeout) is still dropped inside the span.
    pub(crate) struct InSpan<F> {
        span: Span,
        #[pin]
        future: Option<F>,
    }

    impl<F> PinnedDrop for InSpan<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.future.is_some() {
                let _entered = this.span.enter();
                this.future.set(None);
            }
        }
    }
}

impl<F> InSpan<F> {
    pub(crate) fn new(future: F, span: Span) -> Self {
        InSpan {
            span,
            future: Some(future),
        }
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        let Some(future) = this.future.as_mut().as_pin_mut() else {
            // As an `async fn` does.
            panic!("`InSpan` polled after it finished");
        };
        let output = ready!(future.poll(cx));
        // Finished: what is left of it is dropped here, inside the span.
        this.future.set(None);
        Poll::Ready(output)
    }
}

/// Makes `span` a child of the trace `headers` carry, if any (with the `otel` feature).
pub(crate) fn continue_trace(span: &Span, headers: &Headers) {
    #[cfg(feature = "otel")]
    otel::extract(span, headers);
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{Headers, TRACEPARENT_HEADER};

    pub(super) fn inject(span: &Span, headers: &mut Headers) {
        if span.is_disabled() || headers.contains(TRACEPARENT_HEADER) {
            return;
        }
        let context = span.context();
        // No OpenTelemetry layer records the span: there is no trace to carry.
        if !context.span().span_context().is_valid() {
            return;
        }
        TraceContextPropagator::new().inject_context(&context, &mut Writer(headers));
    }

    pub(super) fn extract(span: &Span, headers: &Headers) {
        if span.is_disabled() || !headers.contains(TRACEPARENT_HEADER) {
            return;
        }
        let parent = TraceContextPropagator::new().extract(&Reader(headers));
        if parent.span().span_context().is_valid() {
            // Fails only for a span already started elsewhere; this one is new.
            let _ = span.set_parent(parent);
        }
    }

    struct Writer<'a>(&'a mut Headers);

    impl Injector for Writer<'_> {
        fn set(&mut self, key: &str, value: String) {
            // An empty `tracestate` says nothing (W3C), and SQS refuses empty attributes.
            if !value.is_empty() {
                self.0.insert(key.to_string(), value);
            }
        }
    }

    struct Reader<'a>(&'a Headers);

    impl Extractor for Reader<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get_str(key)
        }

        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(name, _)| name).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tracing::span::Id;
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::Registry;

    use super::InSpan;

    /// Counts how often spans are entered.
    #[derive(Clone, Default)]
    struct Enters(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for Enters {
        fn on_enter(&self, _id: &Id, _cx: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Notes the span current when it is dropped.
    struct NotesSpanAtDrop(Arc<Mutex<Option<Option<Id>>>>);

    impl Drop for NotesSpanAtDrop {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(tracing::Span::current().id());
        }
    }

    #[test]
    fn a_future_runs_in_its_span_and_once_finished_is_not_entered_again() {
        let enters = Enters::default();
        let subscriber = Registry::default().with(enters.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("delivery");
            let id = span.id();
            let future = InSpan::new(async { tracing::Span::current().id() }, span);
            let seen = futures_util::FutureExt::now_or_never(future);
            assert_eq!(seen, Some(id));
            assert_eq!(enters.0.load(Ordering::Relaxed), 1);
        });
    }

    #[test]
    fn a_future_dropped_before_it_finishes_is_dropped_inside_its_span() {
        let subscriber = Registry::default();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("delivery");
            let id = span.id();
            let seen = Arc::new(Mutex::new(None));
            let notes = NotesSpanAtDrop(seen.clone());
            let mut future = Box::pin(InSpan::new(
                async move {
                    let _notes = notes;
                    std::future::pending::<()>().await;
                },
                span,
            ));
            assert!(futures_util::FutureExt::now_or_never(future.as_mut()).is_none());
            drop(future);
            assert_eq!(*seen.lock().unwrap(), Some(id));
        });
    }
}
