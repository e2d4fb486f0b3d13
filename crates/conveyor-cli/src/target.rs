//! Which broker a command talks to, from its URL: `amqp://…` and `amqps://…` for
//! RabbitMQ, `sqs://region[/endpoint]` for SQS (credentials from the standard AWS chain),
//! `nats://…` for NATS JetStream, `redis://…` for Redis Streams.

use std::fmt;
use std::time::Duration;

use conveyor::{Broker, Delivery, Publisher, QueueDepth};
use conveyor_lapin::{LapinBroker, LapinError, LapinQueue, amqp_properties, redact_url};
use conveyor_nats::{NatsBroker, NatsQueue};
use conveyor_redis::{RedisBroker, RedisQueue};
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

    /// The depth of `queue`, for `conveyor depth` and what a pass counts: by default
    /// [`Broker::queue_depth`]. It fails for a queue that does not exist, also on a
    /// broker whose own reading answers zeros for one (Redis).
    ///
    /// # Errors
    ///
    /// The queue does not exist, or the broker cannot be asked.
    fn depth(
        &self,
        queue: &str,
    ) -> impl Future<Output = Result<QueueDepth, conveyor::Error>> + Send {
        self.queue_depth(queue)
    }

    /// How many messages of `queue` a pass (`peek`, `redrive`) can receive now: those
    /// ready ([`depth`](Inspect::depth)), where the broker counts a message handed back
    /// as ready again.
    ///
    /// # Errors
    ///
    /// As [`depth`](Inspect::depth): the queue does not exist, or the broker cannot be
    /// asked.
    fn receivable(&self, queue: &str) -> impl Future<Output = Result<u64, conveyor::Error>> + Send {
        let depth = self.depth(queue);
        async move { depth.await.map(|depth| depth.ready) }
    }

    /// The most messages `conveyor publish` hands the transport in one call. A transport
    /// checks every message of a call before it sends any, so the fewer calls, the less
    /// is sent before a bad line is found; each call is confirmed before the next.
    const PUBLISH_CALL: usize;

    /// Whether a publish to a queue that does not exist makes it (NATS makes the stream
    /// of a subject no stream takes, Redis's `XADD` the stream of a name it does not
    /// hold). `conveyor publish` then looks the queue up before it sends anything, so
    /// that a mistyped name fails rather than makes a queue no one reads; elsewhere such
    /// a publish fails (or, on RabbitMQ, comes back) by itself.
    const PUBLISH_MAKES_QUEUES: bool = false;
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

/// A JetStream queue is a stream read through the durable consumer every subscription to
/// it shares.
impl Inspect for NatsBroker {
    /// Each call checks all its messages, sends them all, then waits for their
    /// acknowledgements, and says only that one failed: calls of 500 tell which lines
    /// were acknowledged.
    const PUBLISH_CALL: usize = 500;

    /// A publish to a subject no stream takes makes the stream.
    const PUBLISH_MAKES_QUEUES: bool = true;

    /// The queue's stream is there (every command reads the queue's depth before it
    /// receives, which fails for a missing stream); its durable consumer, the one every
    /// subscription to the queue shares, is made if no one has subscribed yet, as a
    /// fetch needs one.
    fn inspect(&self, name: &str) -> NatsQueue {
        self.queue(name)
    }

    /// Those ready and those in flight: JetStream counts a message handed back (a nak,
    /// as a peek or a redrive's passed-over message) as pending acknowledgement, in
    /// flight, though it is delivered again at the next fetch. A pass may so wait for
    /// messages another consumer truly holds: it stops once none comes for a while, and
    /// says so.
    async fn receivable(&self, queue: &str) -> Result<u64, conveyor::Error> {
        let depth = self.queue_depth(queue).await?;
        Ok(depth.ready.saturating_add(depth.in_flight.unwrap_or(0)))
    }
}

/// A Redis queue is a stream read through the consumer group every subscription to it
/// shares, each subscription a consumer of its own in the group.
impl Inspect for RedisBroker {
    /// Each call is one transaction (`MULTI`/`EXEC`): Redis adds all of its messages or
    /// none, and a call whose answer is lost does not say which: calls of 500 tell which
    /// lines Redis has.
    const PUBLISH_CALL: usize = 500;

    /// `XADD` makes the stream of a name Redis does not hold.
    const PUBLISH_MAKES_QUEUES: bool = true;

    /// The queue's stream is there (every command reads the queue's depth before it
    /// receives, which fails for a missing stream); its consumer group is made if no one
    /// has subscribed yet, as a read needs one, and the pass joins it as a consumer of
    /// its own.
    fn inspect(&self, name: &str) -> RedisQueue {
        self.queue(name)
    }

    /// Redis answers zeros for a stream it does not hold, as for an empty one: the queue
    /// is looked up first. Ready are the entries never delivered and those whose lease
    /// lapsed or that were handed back (claimable at once), so the default
    /// [`receivable`](Inspect::receivable), the ready count, counts a peeked message.
    async fn depth(&self, queue: &str) -> Result<QueueDepth, conveyor::Error> {
        if !self.queue_exists(queue).await? {
            return Err(conveyor::Error::Transport {
                transport: "redis",
                source: format!("no queue `{queue}`: Redis holds no stream of that name").into(),
            });
        }
        self.queue_depth(queue).await
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
    /// NATS with JetStream at this URL (which may hold a password or a token).
    Nats(String),
    /// Redis at this `redis://` URL (which may hold a password).
    Redis(String),
}

/// How long an SQS receive long-polls: short, so that a command ends soon after a queue
/// runs dry.
const SQS_WAIT: Duration = Duration::from_secs(2);

/// How long a NATS fetch waits on an empty queue, for the same reason: closing a pass
/// waits for the fetch under way.
const NATS_FETCH_WAIT: Duration = Duration::from_secs(2);

/// How long a Redis read blocks on an empty queue, for the same reason.
const REDIS_FETCH_WAIT: Duration = Duration::from_secs(2);

impl Target {
    /// Parses `url`; the error names the URL with its password hidden.
    pub fn parse(url: &str) -> Result<Target, Failure> {
        if url.starts_with("amqp://") || url.starts_with("amqps://") {
            return Ok(Target::Amqp(url.to_string()));
        }
        if url.starts_with("nats://") {
            return Ok(Target::Nats(url.to_string()));
        }
        if url.starts_with("redis://") {
            return Ok(Target::Redis(url.to_string()));
        }
        if url.starts_with("rediss://") {
            return Err(Failure::usage(format!(
                "`{}`: Redis over TLS (rediss://) is not supported: the Redis transport is built without TLS; use redis://, through a TLS tunnel where the network is not trusted",
                redact_url(url)
            )));
        }
        let Some(rest) = url.strip_prefix("sqs://") else {
            return Err(Failure::usage(format!(
                "unknown broker URL `{}`: expected amqp://…, amqps://…, sqs://region[/endpoint], nats://… or redis://…",
                redact_nats(url)
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

    /// Connects to NATS.
    pub async fn nats(url: &str) -> Result<NatsBroker, Failure> {
        let connected = NatsBroker::builder()
            .url(url)
            .receive_wait(NATS_FETCH_WAIT)
            .build()
            .await;
        // The error names the URL, its password hidden; a token too.
        connected.map_err(|error| {
            let text = conveyor::Report(&error).to_string();
            Failure::broker(match nats_token(url) {
                Some(token) => text.replace(token, "***"),
                None => text,
            })
        })
    }

    /// Connects to Redis. Queues whose declaration sets no visibility timeout are read
    /// with the transport's default lease, as a service with the defaults reads them.
    pub async fn redis(url: &str) -> Result<RedisBroker, Failure> {
        let connected = RedisBroker::builder()
            .url(url)
            .receive_wait(REDIS_FETCH_WAIT)
            .build()
            .await;
        // The error names the URL with its password hidden, which the transport does
        // already; hidden here too, wherever a cause might quote it.
        connected.map_err(|error| {
            let text = conveyor::Report(&error).to_string();
            Failure::broker(conveyor::kit::without_password(&text, url))
        })
    }

    /// Makes the SQS client (nothing is sent until the first command).
    pub async fn sqs(region: &str, endpoint: Option<&str>) -> Result<SqsBroker, Failure> {
        let mut builder = SqsBroker::builder().region(region).receive_wait(SQS_WAIT);
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

/// The token of a NATS URL (`nats://TOKEN@host`: user information with no `:`), which,
/// unlike a password, [`redact_url`] shows.
fn nats_token(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let (user_info, _) = authority.rsplit_once('@')?;
    (!user_info.is_empty() && !user_info.contains(':')).then_some(user_info)
}

/// `url` as it is safe to print: a password hidden, and a NATS URL's token.
fn redact_nats(url: &str) -> String {
    let shown = redact_url(url);
    match nats_token(&shown) {
        Some(token) => shown.replacen(token, "***", 1),
        None => shown,
    }
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

/// Shows the URL as it is safe to print: a password hidden (AMQP's, NATS's, Redis's,
/// or one in an SQS endpoint), and a NATS token.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Amqp(url) | Target::Redis(url) => f.write_str(&redact_url(url)),
            Target::Nats(url) => f.write_str(&redact_nats(url)),
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
    fn nats_urls_are_kept_whole_and_shown_without_their_password_or_token() {
        let target = Target::parse("nats://app:s3cret@nats.internal:4222").unwrap();
        assert_eq!(
            target,
            Target::Nats("nats://app:s3cret@nats.internal:4222".into())
        );
        assert_eq!(target.to_string(), "nats://app:***@nats.internal:4222");
        let target = Target::parse("nats://s3cret@nats.internal:4222").unwrap();
        assert_eq!(target.to_string(), "nats://***@nats.internal:4222");
        assert_eq!(
            Target::parse("nats://127.0.0.1:4222").unwrap().to_string(),
            "nats://127.0.0.1:4222"
        );
        assert_eq!(nats_token("nats://user:pw@host"), None);
        assert_eq!(nats_token("nats://host:4222"), None);
        assert!(NatsBroker::drops_key("orders").is_none());
    }

    #[test]
    fn redis_urls_are_kept_whole_and_shown_without_their_password() {
        let target = Target::parse("redis://app:s3cret@cache.internal:6379/2").unwrap();
        assert_eq!(
            target,
            Target::Redis("redis://app:s3cret@cache.internal:6379/2".into())
        );
        assert_eq!(target.to_string(), "redis://app:***@cache.internal:6379/2");
        // A password with no user name, as Redis before ACLs takes it.
        let target = Target::parse("redis://:s3cret@cache.internal:6379").unwrap();
        assert_eq!(target.to_string(), "redis://:***@cache.internal:6379");
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379").unwrap().to_string(),
            "redis://127.0.0.1:6379"
        );
        assert!(RedisBroker::drops_key("orders").is_none());
    }

    #[test]
    fn rediss_is_refused_as_a_usage_error_that_says_why_without_the_password() {
        let error = Target::parse("rediss://app:s3cret@cache.internal:6380").unwrap_err();
        assert_eq!(error.code, 2, "{error}");
        let text = error.to_string();
        assert!(
            text.contains("rediss://app:***@cache.internal:6380"),
            "{text}"
        );
        assert!(text.contains("TLS"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
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
        let error = Target::parse("kafka://u:hunter2@host").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        let error = Target::parse("tcp://hunter2@host").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(Target::parse("sqs://").is_err());
    }
}
