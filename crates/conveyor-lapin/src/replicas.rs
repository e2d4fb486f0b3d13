//! Replicas of a service sharing the shard queues of a [`ConsistentHash`] exchange, each
//! shard consumed by one replica at a time, with no coordinator besides the broker.
//!
//! How: see [`ReplicaGroup`].
//!
//! [`ConsistentHash`]: crate::ConsistentHash

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use conveyor::shards::{self, PlanSender, ShardPlan, Shards};
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::broker::LapinBroker;
use crate::error::short;
use crate::publisher::can_publish;
use crate::queue::LapinQueue;
use crate::topology::{ExchangeSpec, ExchangeType};

/// The default time between two heartbeats of a replica.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// A member not heard from for this many heartbeats is gone.
pub const MISSED_HEARTBEATS: u32 = 3;

/// How a replica joins its group: the group's name, the number of shards, the heartbeat.
///
/// ```no_run
/// use conveyor::App;
/// use conveyor_lapin::{ConsistentHash, LapinBroker, ReplicaGroup, RabbitQueueSpec};
///
/// async fn handle(_: conveyor::Bytes, key: conveyor::PartitionKey) {}
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672").await?;
/// let queues = ConsistentHash::new("orders", 12)
///     .queue(|spec| spec.single_active_consumer())
///     .declare(&broker)
///     .await?;
/// let group = ReplicaGroup::new("orders", 12).join(&broker).await?;
/// App::new("orders")
///     .mount(group.shards(queues), handle, |m| m.workers(8).by_key())
///     .run()
///     .await?;
/// group.leave().await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ReplicaGroupBuilder {
    group: String,
    shards: usize,
    heartbeat: Duration,
    id: Option<String>,
}

/// A replica's membership of its group: the plan of the shards it should hold, kept up
/// to date from the group's heartbeats. [`ReplicaGroup::new`] starts one
/// ([`ReplicaGroupBuilder`] shows a whole service).
///
/// How the replicas agree:
///
/// - **Membership over a fanout exchange.** Each replica binds a queue of its own
///   (`<group>.replicas.<id>`, deleted when it leaves, or by the broker once unused
///   for a minute) to `<group>.replicas` and
///   publishes a heartbeat there every `heartbeat` (its id and the shards it holds). A
///   replica not heard from for three heartbeats is gone; one that shuts down cleanly
///   says so ([`ReplicaGroup::leave`]), and is gone at once.
/// - **The same plan everywhere.** Each replica computes the plan from the live members
///   with [`conveyor::shards::assign`]: 4 shards each for 12 over 3 replicas, 6 each
///   once one is gone. A replica just (re)connected waits one and a half heartbeats, to
///   have heard everyone, before it plans.
/// - **Single active consumer as the safety net.** The shard queues must be declared
///   with [`single_active_consumer`](crate::RabbitQueueSpec::single_active_consumer):
///   while two replicas' views disagree (for less than a heartbeat, or through a
///   partition), both may subscribe to a shard, and RabbitMQ lets only one consume.
/// - **Handover by channel close.** A replica giving a shard up stops handing its
///   deliveries to handlers, waits for those handed out to be settled, then closes the
///   shard's channel without cancelling its consumer first: the broker puts back what the
///   channel read ahead and activates the next consumer in one step, so the next holder
///   starts from the oldest message left. (A `basic.cancel` first would activate the
///   next consumer while this one still held read-ahead, which the next one would then
///   receive after later messages.)
///
/// Why heartbeats rather than single active consumer alone: a queue's active consumer is
/// the first to subscribe, so every replica subscribing to every shard would leave most
/// shards with the first replica to start. The heartbeats decide the spread; single
/// active consumer only guards it.
///
/// A replica killed (or cut off): its connection goes, the broker puts its unacknowledged
/// messages back, and after three heartbeats the others take its shards. Messages it had
/// handled but not acknowledged are handled again by the next holder: the one exception
/// to "in order, once" (they come marked redelivered). A replica cut from the broker
/// keeps its last plan; its subscriptions come back with its connection, and single
/// active consumer keeps them idle while another replica holds the shards, until the
/// views agree again.
///
/// [`ConsistentHash`]: crate::ConsistentHash
#[derive(Debug)]
pub struct ReplicaGroup {
    id: String,
    group: String,
    plan: ShardPlan,
    members: watch::Receiver<Vec<String>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ReplicaGroup {
    /// The group `group` (its exchange is `<group>.replicas`) over `shards` shards.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(group: impl Into<String>, shards: usize) -> ReplicaGroupBuilder {
        ReplicaGroupBuilder {
            group: group.into(),
            shards,
            heartbeat: DEFAULT_HEARTBEAT,
            id: None,
        }
    }

    /// This replica's id in the group.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The members this replica hears now, itself included, in order.
    pub fn members(&self) -> Vec<String> {
        self.members.borrow().clone()
    }

    /// The shards the plan gives this replica now.
    pub fn planned(&self) -> Vec<usize> {
        self.plan.wanted()
    }

    /// The source to mount: `queues` (shard `i` is `queues[i]`, as
    /// [`ConsistentHash::declare`](crate::ConsistentHash::declare) returns them), of
    /// which it holds those the plan gives this replica.
    pub fn shards(&self, queues: Vec<LapinQueue>) -> Shards<LapinQueue> {
        Shards::new(self.group.clone(), queues, self.plan.clone())
    }

    /// Leaves the group: tells the others (who then take this replica's shards at
    /// once, their consumers idle until this replica's close) and stops the heartbeats.
    /// Dropping the group stops the heartbeats without telling: the others take over
    /// after three heartbeats.
    pub async fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ReplicaGroup {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl ReplicaGroupBuilder {
    /// The time between two heartbeats ([`DEFAULT_HEARTBEAT`]). A replica is taken for
    /// gone after [`MISSED_HEARTBEATS`] of them, so this bounds how long its shards wait
    /// for another holder when it dies.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }

    /// This replica's id (unique in the group). By default the group's name, the process
    /// id and the time it joined.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Declares the group's exchange and starts taking part: heartbeats, and the plan.
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Config`] for no shard or a zero heartbeat, and what declaring
    /// the exchange fails with.
    pub async fn join(self, broker: &LapinBroker) -> Result<ReplicaGroup, conveyor::Error> {
        if self.shards == 0 || self.heartbeat.is_zero() {
            return Err(conveyor::Error::config(format!(
                "the replica group `{}` needs at least one shard and a heartbeat above zero",
                self.group
            )));
        }
        let exchange = format!("{}.replicas", self.group);
        broker
            .declare_exchange(&ExchangeSpec::new(&exchange, ExchangeType::Fanout))
            .await?;
        let id = self.id.unwrap_or_else(|| {
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!(
                "{}-{}-{:x}",
                self.group,
                std::process::id(),
                since.as_micros()
            )
        });
        let (sender, plan) = shards::plan();
        let (members_tx, members) = watch::channel(vec![id.clone()]);
        let (stop, stopped) = oneshot::channel();
        let member = Member {
            broker: broker.clone(),
            id: id.clone(),
            exchange,
            shards: self.shards,
            heartbeat: self.heartbeat,
            sender,
            members: members_tx,
        };
        let task = tokio::spawn(member.run(stopped));
        Ok(ReplicaGroup {
            id,
            group: self.group,
            plan,
            members,
            stop: Some(stop),
            task: Some(task),
        })
    }
}

/// How long a replica's membership queue outlives its last use (RabbitMQ's
/// `x-expires`): one left without a consumer (a replica gone between declaring it and
/// consuming) would otherwise gather every heartbeat of the group for ever. The same for
/// every replica and heartbeat, so that declaring it again never meets other arguments.
const MEMBER_QUEUE_EXPIRES_MS: i64 = 60_000;

/// The task that keeps a replica's membership.
struct Member {
    broker: LapinBroker,
    id: String,
    exchange: String,
    shards: usize,
    heartbeat: Duration,
    sender: PlanSender,
    members: watch::Sender<Vec<String>>,
}

/// How a session with the broker ended.
enum Ended {
    Left,
    Lost(String),
}

impl Member {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        loop {
            match self.session(&mut stop).await {
                Ended::Left => return,
                Ended::Lost(error) => {
                    // The plan stays as it was: the subscriptions recover with their
                    // connection, and single active consumer guards the shards meanwhile.
                    tracing::warn!(group = %self.exchange, %error, "lost the replica group; joining again");
                    tokio::select! {
                        _ = &mut stop => return,
                        () = tokio::time::sleep(self.heartbeat) => {}
                    }
                }
            }
        }
    }

    /// One connection's worth of membership: a queue bound to the exchange, heartbeats
    /// out, the others' heartbeats in.
    async fn session(&self, stop: &mut oneshot::Receiver<()>) -> Ended {
        let opened = async {
            let listening = self
                .broker
                .open_channel("replica group")
                .await
                .map_err(text)?;
            // Named by the replica, not by the server: lapin declares the queue again by
            // its name when it recovers the connection, and RabbitMQ refuses a client the
            // `amq.gen-` names it makes itself, which failed the whole recovery. Neither
            // exclusive nor auto-delete, because recovery can declare it again before
            // the broker has noticed the old connection is gone: an exclusive queue
            // would be refused, and an auto-delete one deleted when the old consumer
            // goes, under the consumer recovery is about to restore (NOT_FOUND, and
            // another reconnect). `x-expires` removes the queue of a replica that died.
            let mut arguments = FieldTable::default();
            arguments.insert(
                "x-expires".into(),
                AMQPValue::LongLongInt(MEMBER_QUEUE_EXPIRES_MS),
            );
            let queue = listening
                .queue_declare(
                    short("queue name", &format!("{}.{}", self.exchange, self.id)).map_err(text)?,
                    QueueDeclareOptions::default(),
                    arguments,
                )
                .await
                .map_err(text)?;
            listening
                .queue_bind(
                    queue.name().clone(),
                    short("exchange name", &self.exchange).map_err(text)?,
                    short("routing key", "").map_err(text)?,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(text)?;
            let consumer = listening
                .basic_consume(
                    queue.name().clone(),
                    short("consumer tag", &self.id).map_err(text)?,
                    BasicConsumeOptions {
                        no_ack: true,
                        ..BasicConsumeOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(text)?;
            // Heartbeats go out on the publishing connection, like every publish: a
            // resource alarm blocks a connection that publishes, acks and all.
            let speaking = self
                .broker
                .inner
                .publishing
                .create_channel()
                .await
                .map_err(text)?;
            Ok::<_, String>((listening, queue.name().clone(), consumer, speaking))
        };
        let (listening, queue_name, mut consumer, speaking) = match opened.await {
            Ok(opened) => opened,
            Err(error) => return Ended::Lost(error),
        };
        let mut joined = Instant::now();
        // Set while the listening channel waits for lapin to recover its connection.
        let mut listening_lost = false;
        let warm_up = self.heartbeat + self.heartbeat / 2;
        let expiry = self.heartbeat * MISSED_HEARTBEATS;
        let mut seen: BTreeMap<String, Instant> = BTreeMap::new();
        let mut tick = tokio::time::interval(self.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ended = loop {
            tokio::select! {
                _ = &mut *stop => {
                    if let Err(error) = self.publish(&speaking, true).await {
                        tracing::debug!(group = %self.exchange, %error, "telling the group this replica leaves failed");
                    }
                    break Ended::Left;
                }
                _ = tick.tick() => {
                    if let Err(error) = self.publish(&speaking, false).await {
                        // lapin brings the channel back with its connection: this beat is
                        // skipped, the session goes on. Ending it here would close
                        // channels that are reconnecting, which lapin restores anyway.
                        if !can_publish(&speaking) {
                            break Ended::Lost(error);
                        }
                        tracing::debug!(group = %self.exchange, %error, "a heartbeat was not sent; its connection is being recovered");
                    }
                }
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => match Heartbeat::parse(&delivery.data) {
                        Some(beat) if beat.id == self.id => {}
                        Some(beat) if beat.leaving => {
                            tracing::info!(group = %self.exchange, member = %beat.id, "a replica left");
                            seen.remove(&beat.id);
                        }
                        Some(beat) => {
                            if seen.insert(beat.id.clone(), Instant::now()).is_none() {
                                tracing::info!(group = %self.exchange, member = %beat.id, held = ?beat.held, "a replica joined");
                            }
                        }
                        None => tracing::debug!(group = %self.exchange, "ignored a heartbeat that does not parse"),
                    },
                    // The channel's connection was lost: lapin recovers it and the
                    // stream goes on, unless the channel is gone for good.
                    Some(Err(error)) if !can_publish(&listening) => break Ended::Lost(conveyor::Report(&error).to_string()),
                    Some(Err(error)) => tracing::debug!(group = %self.exchange, error = %conveyor::Report(&error), "the heartbeat consumer waits for its connection"),
                    None => break Ended::Lost("the heartbeat consumer ended".to_string()),
                },
            }
            // While the heartbeats cannot come in, the plan stays as it was (single
            // active consumer guards the shards meanwhile). Once they can again, each
            // member known gets a whole expiry to be heard from, and the plan waits a
            // warm-up, as at joining.
            if !listening.status().connected() {
                listening_lost = true;
                continue;
            }
            if std::mem::take(&mut listening_lost) {
                let now = Instant::now();
                seen.values_mut().for_each(|last| *last = now);
                joined = now;
            }
            seen.retain(|member, last| {
                let alive = last.elapsed() < expiry;
                if !alive {
                    tracing::warn!(group = %self.exchange, %member, "a replica went silent; taking it for gone");
                }
                alive
            });
            if joined.elapsed() >= warm_up {
                self.plan(&seen);
            }
        };
        if matches!(ended, Ended::Left) {
            let deleted = listening
                .queue_delete(queue_name, QueueDeleteOptions::default())
                .await;
            if let Err(error) = deleted {
                tracing::debug!(group = %self.exchange, error = %conveyor::Report(&error), "deleting the membership queue failed; it expires unused");
            }
        }
        let _ = listening.close(200, "left the replica group".into()).await;
        let _ = speaking.close(200, "left the replica group".into()).await;
        ended
    }

    /// Sets the plan for the members `seen` and this replica.
    fn plan(&self, seen: &BTreeMap<String, Instant>) {
        let mut members: BTreeSet<String> = seen.keys().cloned().collect();
        members.insert(self.id.clone());
        let mine = shards::assigned_to(&self.id, &members, self.shards);
        self.sender.set(mine);
        let members: Vec<String> = members.into_iter().collect();
        self.members.send_if_modified(|now| {
            let changed = *now != members;
            *now = members;
            changed
        });
    }

    async fn publish(&self, channel: &Channel, leaving: bool) -> Result<(), String> {
        let beat = serde_json::json!({
            "id": self.id,
            "held": self.sender.held(),
            "leaving": leaving,
        });
        let payload = serde_json::to_vec(&beat).map_err(text)?;
        // A heartbeat is stale once the sender would be taken for gone.
        let ttl = (self.heartbeat * MISSED_HEARTBEATS).as_millis().to_string();
        let properties =
            BasicProperties::default().with_expiration(short("expiration", &ttl).map_err(text)?);
        channel
            .basic_publish(
                short("exchange name", &self.exchange).map_err(text)?,
                short("routing key", "").map_err(text)?,
                BasicPublishOptions::default(),
                &payload,
                properties,
            )
            .await
            .map_err(text)?;
        Ok(())
    }
}

fn text(error: impl std::error::Error + 'static) -> String {
    conveyor::Report(&error).to_string()
}

/// A heartbeat as received.
struct Heartbeat {
    id: String,
    held: Vec<u64>,
    leaving: bool,
}

impl Heartbeat {
    fn parse(data: &[u8]) -> Option<Heartbeat> {
        let value: serde_json::Value = serde_json::from_slice(data).ok()?;
        Some(Heartbeat {
            id: value.get("id")?.as_str()?.to_string(),
            held: value
                .get("held")
                .and_then(serde_json::Value::as_array)
                .map(|held| held.iter().filter_map(serde_json::Value::as_u64).collect())
                .unwrap_or_default(),
            leaving: value
                .get("leaving")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_parses_and_one_without_an_id_does_not() {
        let beat = Heartbeat::parse(br#"{"id":"a","held":[1,2],"leaving":true}"#);
        assert!(beat.is_some_and(|beat| beat.id == "a" && beat.held == [1, 2] && beat.leaving));
        assert!(Heartbeat::parse(br#"{"held":[1]}"#).is_none());
        assert!(Heartbeat::parse(b"not json").is_none());
    }
}
