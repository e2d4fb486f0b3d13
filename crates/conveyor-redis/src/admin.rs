//! The portable broker calls on Redis: declaring a queue (its stream, group and policy),
//! deleting it, its depth, and taking its dead letters.

use conveyor::kit::{QueuePolicy, drain_dead_letters};
use conveyor::{DeadLetter, Error, QueueDepth, QueueSpec, Report};

use crate::broker::{GROUP, Keys, RedisBroker, policy};
use crate::error::failed;
use crate::fields::{Entries, Entry};

/// What a queue's policy hash keeps.
pub(crate) async fn make_group(broker: &RedisBroker, keys: &Keys) -> Result<(), Error> {
    let made: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&keys.stream)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut broker.commands())
        .await;
    match made {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(failed("XGROUP CREATE", &keys.stream, Report(&e))),
    }
}

pub(crate) async fn declare(broker: &RedisBroker, spec: &QueueSpec) -> Result<(), Error> {
    let name = spec.name();
    if name.is_empty() {
        return Err(Error::config("a queue needs a name"));
    }
    if spec.delivery_delay().is_some() {
        return Err(Error::config(format!(
            "queue `{name}`: Redis delays no queue as a whole; delay each message (`Message::builder().delay`)"
        )));
    }
    let keys = Keys::of(name);
    make_group(broker, &keys).await?;
    let policy = QueuePolicy::of(spec);
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("DEL").arg(&keys.policy).ignore();
    let fields = policy.fields();
    if !fields.is_empty() {
        pipe.cmd("HSET").arg(&keys.policy);
        for (name, value) in fields {
            pipe.arg(name).arg(value);
        }
        pipe.ignore();
    }
    pipe.query_async::<()>(&mut broker.commands())
        .await
        .map_err(|e| failed("HSET", name, Report(&e)))
}

pub(crate) async fn delete(broker: &RedisBroker, name: &str) -> Result<(), Error> {
    let keys = Keys::of(name);
    let mut commands = broker.commands();
    let delayed: Vec<String> = redis::cmd("ZRANGE")
        .arg(&keys.delayed)
        .arg(0)
        .arg(-1)
        .query_async(&mut commands)
        .await
        .map_err(|e| failed("ZRANGE", name, Report(&e)))?;
    let mut pipe = redis::pipe();
    pipe.cmd("DEL")
        .arg(&keys.stream)
        .arg(&keys.delayed)
        .arg(&keys.policy);
    for id in delayed {
        pipe.arg(format!("{}{id}", keys.delayed_entry));
    }
    pipe.ignore();
    pipe.query_async::<()>(&mut commands)
        .await
        .map_err(|e| failed("DEL", name, Report(&e)))
}

/// How many pending entries a depth reading looks through for lapsed leases.
const PENDING_SCAN: usize = 10_000;

pub(crate) async fn depth(broker: &RedisBroker, name: &str) -> Result<QueueDepth, Error> {
    let keys = Keys::of(name);
    let visibility = policy(broker, &keys)
        .await?
        .visibility_timeout
        .unwrap_or(broker.settings().visibility_timeout);
    let mut commands = broker.commands();
    let (length, delayed): (u64, u64) = redis::pipe()
        .cmd("XLEN")
        .arg(&keys.stream)
        .cmd("ZCARD")
        .arg(&keys.delayed)
        .query_async(&mut commands)
        .await
        .map_err(|e| failed("XLEN", name, Report(&e)))?;
    let summary: redis::RedisResult<redis::Value> = redis::cmd("XPENDING")
        .arg(&keys.stream)
        .arg(GROUP)
        .query_async(&mut commands)
        .await;
    let pending = match summary {
        Ok(redis::Value::Array(values)) => match values.first() {
            Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        },
        Ok(_) => 0,
        // No group yet: nothing was delivered.
        Err(e) if e.code() == Some("NOGROUP") => 0,
        Err(e) => return Err(failed("XPENDING", name, Report(&e))),
    };
    let lapsed: usize = if pending == 0 {
        0
    } else {
        let lapsed: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(&keys.stream)
            .arg(GROUP)
            .arg("IDLE")
            .arg(u64::try_from(visibility.as_millis()).unwrap_or(u64::MAX))
            .arg("-")
            .arg("+")
            .arg(PENDING_SCAN)
            .query_async(&mut commands)
            .await
            .map_err(|e| failed("XPENDING", name, Report(&e)))?;
        lapsed.ids.len()
    };
    let lapsed = lapsed as u64;
    let never_delivered = length.saturating_sub(pending);
    Ok(QueueDepth::new(never_delivered.saturating_add(lapsed))
        .in_flight(pending.saturating_sub(lapsed))
        .delayed(delayed))
}

/// Takes up to `max` entries out of queue `name`, oldest first.
pub(crate) async fn take(
    broker: &RedisBroker,
    name: &str,
    max: usize,
) -> Result<Vec<DeadLetter>, Error> {
    let commands = broker.commands();
    drain_dead_letters(max, |wanted| {
        let mut commands = commands.clone();
        async move {
            let Entries(range) = redis::cmd("XRANGE")
                .arg(name)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(wanted)
                .query_async(&mut commands)
                .await
                .map_err(|e| failed("XRANGE", name, Report(&e)))?;
            if range.is_empty() {
                return Ok((0, Vec::new()));
            }
            let took = range.len();
            let ids: Vec<&str> = range.iter().map(|entry| entry.id.as_str()).collect();
            // Acknowledged first, so that none stays pending in the group (a peek may have
            // read it), where depth would count it ready; a queue with no group has none.
            let acked: redis::RedisResult<()> = redis::cmd("XACK")
                .arg(name)
                .arg(GROUP)
                .arg(&ids)
                .query_async(&mut commands)
                .await;
            if let Err(e) = acked
                && e.code() != Some("NOGROUP")
            {
                return Err(failed("XACK", name, Report(&e)));
            }
            let mut delete = redis::cmd("XDEL");
            delete.arg(name);
            let mut letters = Vec::new();
            for Entry { id, message } in range {
                delete.arg(&id);
                if let Some(incoming) = message {
                    letters.push(DeadLetter::new(
                        incoming.payload,
                        incoming.headers,
                        incoming.key,
                    ));
                }
            }
            delete
                .query_async::<()>(&mut commands)
                .await
                .map_err(|e| failed("XDEL", name, Report(&e)))?;
            Ok((took, letters))
        }
    })
    .await
}
