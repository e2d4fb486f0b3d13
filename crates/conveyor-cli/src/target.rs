//! Which broker a command talks to, from its URL: `amqp://…` and `amqps://…` for
//! RabbitMQ, `sqs://region[/endpoint]` for SQS (credentials from the standard AWS chain).

use std::fmt;
use std::time::Duration;

use conveyor::{Broker, Delivery, Publisher};
use conveyor_lapin::{LapinBroker, LapinError, LapinQueue, amqp_properties, redact_url};
use conveyor_sqs::{SqsBroker, SqsQueue, attribute_types};

use crate::Failure;
use crate::redrive::{Form, redriven, redriven_amqp};

/// A broker as the command line reads it: its queues opened as they are, declaring
/// nothing (no queue, no delay queue) behind the operator's back.
pub trait Inspect: Broker {
    /// The queue `name`, to receive from without declaring anything.
    fn inspect(&self, name: &str) -> Self::Queue;

    /// Whether a publish that failed with `error` did not arrive: it reached the broker
    /// and was not taken (RabbitMQ returns a message no queue took, and nacks one its
    /// queue refused, a full `reject-publish` queue say), or it was never sent. Of a call
    /// of one message, that one did not arrive; of a call of several, the error does not
    /// say which.
    fn undelivered(error: &conveyor::Error) -> bool {
        let _ = error;
        false
    }

    /// Why a partition key given to messages for `queue` would not reach it, where it
    /// would not: `conveyor publish --key` refuses to drop the key without a word.
    fn drops_key(queue: &str) -> Option<String> {
        let _ = queue;
        None
    }

    /// Publishes `delivery`, a dead letter received from this broker, to the queue `to`,
    /// redriven in `form`: as [`redriven`] makes it, or with more of the message where the
    /// broker keeps what the portable view leaves out.
    fn publish_redriven(
        &self,
        to: &str,
        delivery: &Delivery,
        form: Form,
    ) -> impl Future<Output = Result<(), conveyor::Error>> + Send {
        self.publish(to, redriven(delivery, form))
    }

    /// The most messages `conveyor publish` hands the transport in one call. A transport
    /// checks every message of a call before it sends any, so the fewer calls, the less
    /// is sent before a bad line is found; each call is confirmed before the next.
    const PUBLISH_CALL: usize;
}

impl Inspect for LapinBroker {
    /// Each call sends all its messages before it waits for their confirms, and says
    /// only that one failed: calls of 500 tell which lines were confirmed.
    const PUBLISH_CALL: usize = 500;

    fn inspect(&self, name: &str) -> LapinQueue {
        self.queue(name).passive()
    }

    /// With its AMQP properties and typed header values, which the portable message
    /// would turn into text headers.
    async fn publish_redriven(
        &self,
        to: &str,
        delivery: &Delivery,
        form: Form,
    ) -> Result<(), conveyor::Error> {
        match amqp_properties(delivery) {
            Some(received) => {
                let properties =
                    redriven_amqp(delivery, &received, form).map_err(|e| e.into_publish(to))?;
                self.publish_amqp("", to, delivery.payload().clone(), properties)
                    .await
            }
            None => self.publish(to, redriven(delivery, form)).await,
        }
    }

    /// A mandatory publish that no queue took (a queue that does not exist, say) comes
    /// back with `basic.return` before its confirm; one its queue refused is nacked. One
    /// that waited out the confirm timeout for a lost connection's recovery, or for a
    /// resource alarm's block to end, was never written.
    fn undelivered(error: &conveyor::Error) -> bool {
        let conveyor::Error::Publish { source, .. } = error else {
            return false;
        };
        matches!(
            source.downcast_ref::<LapinError>(),
            Some(
                LapinError::Returned { .. }
                    | LapinError::Nacked { .. }
                    | LapinError::Unavailable { .. }
                    | LapinError::Blocked { .. }
            )
        )
    }
}

/// An SQS subscription looks its queue up and declares nothing.
impl Inspect for SqsBroker {
    /// One call for the whole input: every message is checked before any is sent, and a
    /// failure names, by index, each message not sent.
    const PUBLISH_CALL: usize = usize::MAX;

    fn inspect(&self, name: &str) -> SqsQueue {
        self.queue(name)
    }

    /// With the data types its attributes came with (`Number`, custom types, `Binary`
    /// holding text), which the portable message would send as `String`.
    async fn publish_redriven(
        &self,
        to: &str,
        delivery: &Delivery,
        form: Form,
    ) -> Result<(), conveyor::Error> {
        // The redrive gives the message a new id, text whatever the old one's type.
        let types = attribute_types(delivery)
            .unwrap_or_default()
            .without(conveyor::MESSAGE_ID_HEADER);
        self.publish_typed(to, redriven(delivery, form), &types)
            .await
    }

    /// A standard queue has no message groups, so the publisher sends no key there. SQS
    /// makes every FIFO queue's name end in `.fifo`, so the name (a URL's last part)
    /// tells, with no call.
    fn drops_key(queue: &str) -> Option<String> {
        let name = queue.rsplit('/').next().unwrap_or(queue);
        (!name.ends_with(".fifo")).then(|| {
            format!(
                "`{queue}` is a standard SQS queue, which carries no partition key (only a FIFO queue, named `….fifo`, keeps it, as the message group): leave out --key"
            )
        })
    }
}

/// A broker URL, parsed.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// RabbitMQ at this AMQP URL (which may hold a password).
    Amqp(String),
    /// SQS in `region`, at `endpoint` when one is given (an emulator, a VPC endpoint).
    Sqs {
        region: String,
        endpoint: Option<String>,
    },
}

/// How long an SQS receive long-polls: short, so that a command ends soon after a queue
/// runs dry.
const SQS_WAIT: Duration = Duration::from_secs(2);

impl Target {
    /// Parses `url`; the error names the URL with its password hidden.
    pub fn parse(url: &str) -> Result<Target, Failure> {
        if url.starts_with("amqp://") || url.starts_with("amqps://") {
            return Ok(Target::Amqp(url.to_string()));
        }
        let Some(rest) = url.strip_prefix("sqs://") else {
            return Err(Failure::usage(format!(
                "unknown broker URL `{}`: expected amqp://…, amqps://… or sqs://region[/endpoint]",
                redact_url(url)
            )));
        };
        let (region, endpoint) = match rest.split_once('/') {
            Some((region, endpoint)) if !endpoint.is_empty() => (region, Some(endpoint)),
            Some((region, _)) => (region, None),
            None => (rest, None),
        };
        if region.is_empty() {
            return Err(Failure::usage(format!(
                "the SQS URL `{}` names no region: sqs://us-east-1, say",
                redact_url(url)
            )));
        }
        check_region(region)?;
        Ok(Target::Sqs {
            region: region.to_string(),
            endpoint: endpoint.map(endpoint_url),
        })
    }

    /// Connects to RabbitMQ.
    pub async fn rabbitmq(url: &str) -> Result<LapinBroker, Failure> {
        // The error names the URL, its password hidden.
        LapinBroker::connect(url)
            .await
            .map_err(|error| Failure::broker(conveyor::Report(&error).to_string()))
    }

    /// Makes the SQS client (nothing is sent until the first command).
    pub async fn sqs(region: &str, endpoint: Option<&str>) -> Result<SqsBroker, Failure> {
        let mut builder = SqsBroker::builder().region(region).wait_time(SQS_WAIT);
        if let Some(endpoint) = endpoint {
            builder = builder.endpoint(endpoint);
        }
        builder.build().await.map_err(|error| {
            Failure::broker(format!(
                "cannot set up SQS in {region}: {}",
                conveyor::Report(&error)
            ))
        })
    }
}

/// Refuses a region AWS could not have (lowercase letters, digits and `-`, as
/// `us-east-1`), which the SDK would only turn down at the first call, with a message that
/// does not say the URL is at fault. The error never shows the region: one with `@` or
/// `:` is most likely credentials put in the URL.
fn check_region(region: &str) -> Result<(), Failure> {
    let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if region.chars().all(valid) {
        return Ok(());
    }
    Err(Failure::usage(if region.contains(['@', ':']) {
        "an SQS URL takes no credentials (they come from the standard AWS chain): sqs://region[/endpoint]"
    } else {
        "the SQS URL's region is not one: lowercase letters, digits and `-`, as in sqs://us-east-1"
    }))
}

/// An endpoint with its scheme: as given, or `http://` for the local machine (an
/// emulator) and `https://` for any other host.
fn endpoint_url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        return endpoint.to_string();
    }
    let host = endpoint.split([':', '/']).next().unwrap_or_default();
    let local = matches!(host, "localhost" | "127.0.0.1" | "[::1]");
    let scheme = if local { "http" } else { "https" };
    format!("{scheme}://{endpoint}")
}

/// Shows the URL as it is safe to print: a password hidden (AMQP's, or one in an SQS
/// endpoint).
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Amqp(url) => f.write_str(&redact_url(url)),
            Target::Sqs { region, endpoint } => match endpoint {
                Some(endpoint) => write!(f, "sqs://{region}/{}", redact_url(endpoint)),
                None => write!(f, "sqs://{region}"),
            },
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amqp_urls_are_kept_whole_and_shown_without_their_password() {
        let target = Target::parse("amqp://app:s3cret@rabbit:5672/prod").unwrap();
        assert_eq!(
            target,
            Target::Amqp("amqp://app:s3cret@rabbit:5672/prod".into())
        );
        assert_eq!(target.to_string(), "amqp://app:***@rabbit:5672/prod");
    }

    #[test]
    fn sqs_urls_give_a_region_and_an_optional_endpoint() {
        assert_eq!(
            Target::parse("sqs://eu-west-1").unwrap(),
            Target::Sqs {
                region: "eu-west-1".into(),
                endpoint: None
            }
        );
        assert_eq!(
            Target::parse("sqs://us-east-1/127.0.0.1:4566").unwrap(),
            Target::Sqs {
                region: "us-east-1".into(),
                endpoint: Some("http://127.0.0.1:4566".into())
            }
        );
        assert_eq!(
            Target::parse("sqs://us-east-1/https://sqs.internal:443").unwrap(),
            Target::Sqs {
                region: "us-east-1".into(),
                endpoint: Some("https://sqs.internal:443".into())
            }
        );
        assert_eq!(
            Target::parse("sqs://us-east-1/vpce.example.com").unwrap(),
            Target::Sqs {
                region: "us-east-1".into(),
                endpoint: Some("https://vpce.example.com".into())
            }
        );
    }

    #[test]
    fn only_a_standard_sqs_queue_drops_a_key() {
        assert!(SqsBroker::drops_key("orders").is_some());
        assert!(SqsBroker::drops_key("https://sqs.eu-west-1.amazonaws.com/1/orders").is_some());
        assert!(SqsBroker::drops_key("orders.fifo").is_none());
        assert!(
            SqsBroker::drops_key("https://sqs.eu-west-1.amazonaws.com/1/orders.fifo").is_none()
        );
        assert!(LapinBroker::drops_key("orders").is_none());
    }

    #[test]
    fn an_sqs_region_aws_could_not_have_is_a_usage_error_that_shows_no_secret() {
        for url in [
            "sqs://us east 1/127.0.0.1:4566",
            "sqs://US-EAST-1",
            "sqs://us_east_1",
            "sqs://key:s3cret@us-east-1/127.0.0.1:4566",
            "sqs://s3cret@us-east-1",
        ] {
            let error = Target::parse(url).unwrap_err();
            assert_eq!(error.code, 2, "{url}: {error}");
            assert!(error.to_string().contains("sqs://"), "{url}: {error}");
            assert!(!error.to_string().contains("s3cret"), "{url}: {error}");
        }
        let error = Target::parse("sqs://key:s3cret@us-east-1").unwrap_err();
        assert!(error.to_string().contains("credentials"), "{error}");
        assert!(Target::parse("sqs://cn-north-1").is_ok());
    }

    #[test]
    fn an_sqs_endpoints_password_is_not_shown() {
        let target = Target::parse("sqs://us-east-1/proxy:s3cret@vpce.example.com").unwrap();
        assert_eq!(
            target.to_string(),
            "sqs://us-east-1/https://proxy:***@vpce.example.com"
        );
    }

    #[test]
    fn a_bad_url_is_refused_without_its_password() {
        let error = Target::parse("redis://u:hunter2@host").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(Target::parse("sqs://").is_err());
    }
}
