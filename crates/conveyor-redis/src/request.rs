//! Request/reply: requests go to a queue with a reply stream of the broker's own,
//! `conveyor:replies:<id>`, which one task reads (on a connection of its own: its reads
//! block) and matches to the waiting requests by correlation id. The stream expires an
//! hour after its last use, so one left by a process that died goes away.

use std::time::Duration;

use conveyor::request::{ReplyReader, Requester};
use conveyor::{Error, Message, Report};

use crate::broker::RedisBroker;
use crate::error::failed;
use crate::fields::ReadEntries;

/// How long a reply stream outlives its last read.
const EXPIRY_SECONDS: u64 = 3600;

/// A requester on a reply stream of its own, and the task reading it (on a connection of
/// its own: its reads block).
pub(crate) async fn open(broker: &RedisBroker) -> Result<Requester, Error> {
    let stream = format!("conveyor:replies:{}", conveyor::kit::unique_id());
    let wait = Duration::from_secs(1);
    let mut reads = crate::broker::connect(
        broker.client(),
        wait.saturating_add(broker.settings().response_timeout),
    )
    .await
    .map_err(|e| failed("connect", &stream, Report(&e)))?;
    let key = stream.clone();
    let reader = ReplyReader::spawn(|waiting| async move {
        let mut last = "$".to_string();
        loop {
            let read: redis::RedisResult<ReadEntries> = redis::cmd("XREAD")
                .arg("BLOCK")
                .arg(u64::try_from(wait.as_millis()).unwrap_or(1000))
                .arg("STREAMS")
                .arg(&key)
                .arg(&last)
                .query_async(&mut reads)
                .await;
            let entries = match read {
                Ok(ReadEntries(entries)) => entries,
                Err(error) => {
                    tracing::warn!(error = %Report(&error), "cannot read replies; trying again");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            let mut seen = Vec::new();
            for entry in entries {
                last.clone_from(&entry.id);
                seen.push(entry.id.clone());
                let Some(incoming) = entry.message else {
                    continue;
                };
                let Some(id) = incoming.headers.get_str(conveyor::CORRELATION_ID_HEADER) else {
                    continue;
                };
                let id = id.to_string();
                waiting.deliver(&id, Message::received(incoming.payload, incoming.headers));
            }
            let mut tidy = redis::pipe();
            if !seen.is_empty() {
                tidy.cmd("XDEL").arg(&key).arg(&seen).ignore();
            }
            tidy.cmd("EXPIRE").arg(&key).arg(EXPIRY_SECONDS).ignore();
            let _: redis::RedisResult<()> = tidy.query_async(&mut reads).await;
        }
    });
    Ok(Requester::new(stream, reader))
}
