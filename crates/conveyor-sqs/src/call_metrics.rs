//! Times every SQS request the broker's client makes, for the
//! `messaging.client.operation.duration` metric (see `conveyor::telemetry`).

use std::time::Instant;

use aws_sdk_sqs::config::interceptors::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_types::config_bag::{Storable, StoreReplace};

/// The SDK interceptor that records each request's duration under its API name.
#[derive(Debug)]
pub(crate) struct TimeCalls;

/// When the request started, kept in the request's own config bag.
#[derive(Clone, Debug)]
struct Started(Instant);

impl Storable for Started {
    type Storer = StoreReplace<Self>;
}

impl Intercept for TimeCalls {
    fn name(&self) -> &'static str {
        "conveyor-time-calls"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().store_put(Started(Instant::now()));
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let (Some(Started(started)), Some(metadata)) =
            (cfg.load::<Started>(), cfg.load::<Metadata>())
        {
            let failed = matches!(context.output_or_error(), Some(Err(_)));
            conveyor::telemetry::record_operation(
                "aws_sqs",
                metadata.name(),
                started.elapsed(),
                failed.then_some("error"),
            );
        }
        Ok(())
    }
}
