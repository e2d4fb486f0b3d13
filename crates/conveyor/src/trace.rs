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
