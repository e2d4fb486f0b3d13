//! Declaring, deleting and inspecting queues and exchanges, on the topology channel that
//! records what it declared so that a new channel declares it again.

use super::*;

impl LapinBroker {
    /// Declares the queue `spec` describes, with its RabbitMQ settings
    /// ([`RabbitQueueSpec`](crate::RabbitQueueSpec), which also says how the portable
    /// ones map). Declaring a queue that exists with the same settings succeeds; with
    /// others, RabbitMQ refuses (PRECONDITION_FAILED), since it cannot change them.
    ///
    /// Settings RabbitMQ cannot take, and a dead-letter queue that does not exist, are
    /// [`conveyor::Error::Config`]; a broker failure is [`conveyor::Error::Transport`]
    /// with the [`LapinError`] as its source.
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Config`] for settings RabbitMQ cannot take and a missing
    /// dead-letter queue; [`conveyor::Error::Transport`] (with the [`LapinError`] as its source) when RabbitMQ fails the call.
    pub async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), conveyor::Error> {
        let declaration = Declaration::from_spec(spec)?;
        if let Some(policy) = spec.dead_letter()
            && self.ready_in(&policy.queue).await?.is_none()
        {
            return Err(conveyor::Error::config(format!(
                "the dead-letter queue `{}` of queue `{}` does not exist; declare it first",
                policy.queue,
                spec.name()
            )));
        }
        let declaration = Arc::new(declaration);
        let declared = &declaration;
        self.on_topology_channel(|channel| async move {
            declared.declare(&channel).await?;
            self.record(Declared::Queue(declared.clone()));
            Ok(())
        })
        .await?;
        conveyor::kit::lock(&self.inner.declared).insert(spec.name().to_string(), declaration);
        Ok(())
    }

    /// Deletes the queue `name`, the messages in it, and its delay queues (the one its
    /// subscriptions on this broker used, and the default ones, `<name>.delay` and
    /// `<name>.delay.quorum`, where they exist) with the messages waiting there. Deleting
    /// a queue that does not exist succeeds.
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Config`] for a name AMQP cannot carry; [`conveyor::Error::Transport`] (with the [`LapinError`] as its source) when RabbitMQ fails the call.
    pub async fn delete_queue(&self, name: &str) -> Result<(), conveyor::Error> {
        short("queue name", name)?;
        // Both default names: another process's subscriptions may have declared either
        // (a quorum queue's is `.delay.quorum`, and an earlier version's `.delay`).
        let mut delay_queues = vec![
            delay_queue_of(name),
            format!("{name}{QUORUM_DELAY_QUEUE_SUFFIX}"),
        ];
        if let Some(remembered) = self.remembered_delay_queue(name)
            && !delay_queues.contains(&remembered)
        {
            delay_queues.push(remembered);
        }
        // The delay queues dead-letter into their queue: deleted first, they cannot move
        // a message into the queue about to go.
        let all = delay_queues.iter().map(String::as_str).chain([name]);
        for queue in all {
            // A name that is too long for AMQP is no queue's name: nothing to delete.
            let Ok(amqp_name) = short("queue name", queue) else {
                continue;
            };
            // On the topology channel, so that it forgets a declaration of the queue it
            // would otherwise replay after a lost connection.
            self.on_topology_channel(|channel| async move {
                match channel
                    .queue_delete(amqp_name, lapin::options::QueueDeleteOptions::default())
                    .await
                {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(source) => {
                        return Err(LapinError::Declare {
                            what: "queue deletion of",
                            name: queue.to_string(),
                            source,
                        });
                    }
                }
                conveyor::kit::lock(&self.inner.topology_record).queue_deleted(queue);
                Ok(())
            })
            .await?;
        }
        conveyor::kit::lock(&self.inner.declared).remove(name);
        conveyor::kit::lock(&self.inner.delay_queues).remove(name);
        Ok(())
    }

    /// How many messages the queue `name` holds: `ready` from a passive declare (which
    /// leaves the queue alone), `delayed` from its delay queue (the one a subscription of
    /// this broker declared, else the default one where it exists (`<name>.delay`, or
    /// `<name>.delay.quorum` for a quorum queue this broker declared), as another process's
    /// subscriptions declare it; found missing, it is looked for again after a minute),
    /// and `in_flight` unknown (`None`: AMQP does not tell how
    /// many are delivered and unacked). A missing queue is an error
    /// ([`LapinError::MissingQueue`] as the source).
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Transport`] for a missing queue ([`LapinError::MissingQueue`])
    /// or a failed call.
    pub async fn queue_depth(&self, name: &str) -> Result<QueueDepth, conveyor::Error> {
        let remembered = self.remembered_delay_queue(name);
        let guessed = remembered.is_none();
        let delay_queue = remembered.or_else(|| {
            (!self.delay_queue_missing(name))
                .then(|| default_delay_queue(name, self.declaration(name).as_deref()))
        });
        let channel = self.open_channel(name).await?;
        let ready = check(&channel, name).await;
        // The delay queue on the same channel: if it is missing, the failed check closes
        // the channel, which is done with anyway.
        let delayed = match (&ready, &delay_queue) {
            (Ok(_), Some(delay_queue)) => check(&channel, delay_queue).await.ok(),
            _ => None,
        };
        if guessed && ready.is_ok() && delayed.is_none() {
            conveyor::kit::lock(&self.inner.missing_delay_queues)
                .insert(name.to_string(), std::time::Instant::now());
        }
        close_quietly(channel).await;
        let mut depth = QueueDepth::new(ready?.into());
        if let Some(delayed) = delayed {
            depth = depth.delayed(delayed.into());
        }
        Ok(depth)
    }

    /// Takes up to `max` messages ready in `dead_letter_queue` out of it (`basic.get`),
    /// in queue order, without waiting for more. Each becomes a [`DeadLetter`] with its
    /// headers read as a subscription reads them, its partition key, and the reason
    /// Conveyor rejected it with (none where RabbitMQ dead-lettered it by itself: a
    /// delivery limit, an expiry, a nack; its `x-death` header is an array, left out of
    /// the headers). They are acked all at once at the end, so on an error none is taken.
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Transport`] for a missing queue or a failed get or ack; then
    /// none is taken.
    pub async fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, conveyor::Error> {
        let queue = short("queue name", dead_letter_queue)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let channel = self.open_channel(dead_letter_queue).await?;
        let taken = take(&channel, queue, dead_letter_queue, max).await;
        close_quietly(channel).await;
        Ok(taken?)
    }

    /// Declares an exchange now (or checks it, if passive).
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Config`] for a name AMQP cannot carry; [`conveyor::Error::Transport`] (with the [`LapinError`] as its source) when RabbitMQ fails the call. (a passive
    /// declaration of a missing exchange included).
    pub async fn declare_exchange(&self, exchange: &ExchangeSpec) -> Result<(), conveyor::Error> {
        if exchange.is_passive() {
            // On a channel of its own: the topology channel would check it again after
            // a lost connection, and one deleted since would fail that channel's recovery.
            let channel = self.open_channel("exchange check").await?;
            let checked = exchange.declare(&channel).await;
            close_quietly(channel).await;
            return checked.map_err(conveyor::Error::from);
        }
        self.on_topology_channel(|channel| async move {
            exchange.declare(&channel).await?;
            self.record(Declared::Exchange(exchange.clone()));
            Ok(())
        })
        .await
        .map_err(conveyor::Error::from)
    }

    /// Binds a queue to an exchange.
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Transport`] (with the [`LapinError`] as its source) when RabbitMQ fails the call.
    pub async fn bind(&self, binding: &Binding) -> Result<(), conveyor::Error> {
        self.on_topology_channel(|channel| async move {
            binding.declare(&channel).await?;
            self.record(Declared::Binding(binding.clone()));
            Ok(())
        })
        .await
        .map_err(conveyor::Error::from)
    }

    /// Notes a declaration that succeeded, under the topology channel's lock: a record
    /// made again on a new channel, and a deletion, are then never between the two.
    pub(super) fn record(&self, declared: Declared) {
        conveyor::kit::lock(&self.inner.topology_record).declared(declared);
    }

    /// Deletes an exchange. Deleting one that does not exist succeeds.
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Config`] for a name AMQP cannot carry; [`conveyor::Error::Transport`] (with the [`LapinError`] as its source) when RabbitMQ fails the call.
    pub async fn delete_exchange(&self, exchange: &str) -> Result<(), conveyor::Error> {
        let name = short("exchange name", exchange)?;
        self.on_topology_channel(|channel| async move {
            match channel
                .exchange_delete(name, lapin::options::ExchangeDeleteOptions::default())
                .await
            {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(LapinError::Declare {
                        what: "exchange deletion of",
                        name: exchange.to_string(),
                        source,
                    });
                }
            }
            conveyor::kit::lock(&self.inner.topology_record).exchange_deleted(exchange);
            Ok(())
        })
        .await
        .map_err(conveyor::Error::from)
    }

    /// How many messages are ready in `queue`, or `None` when it does not exist: a
    /// passive declare on a channel of its own, since a missing queue closes it.
    pub(crate) async fn ready_in(&self, queue: &str) -> Result<Option<u32>, LapinError> {
        // Named by its role: the error of a subscription or a declaration this check is
        // part of names the queue.
        let channel = self.open_channel("queue check").await?;
        let result = check(&channel, queue).await;
        close_quietly(channel).await;
        match result {
            Ok(ready) => Ok(Some(ready)),
            Err(LapinError::MissingQueue { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Runs `f` on the topology channel, opening it first if need be. A failed
    /// declaration closes the channel on the broker's side, so the next call opens a new
    /// one.
    pub(super) async fn on_topology_channel<F, Fut, T>(&self, f: F) -> Result<T, LapinError>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: Future<Output = Result<T, LapinError>>,
    {
        let mut slot = self.inner.topology.lock().await;
        let channel = match slot.as_ref() {
            Some(channel) if channel.status().connected() => channel.clone(),
            None => slot.insert(self.open_channel("topology").await?).clone(),
            Some(_) => slot.insert(self.next_topology_channel().await?).clone(),
        };
        let done = f(channel.clone()).await;
        // A refusal closed the channel: the next one takes over its declarations now,
        // before the connection can be lost (else only at the next declaration).
        let status = channel.status();
        if done.is_err() && !status.connected() && !status.reconnecting() {
            match self.next_topology_channel().await {
                Ok(next) => *slot = Some(next),
                Err(error) => tracing::warn!(
                    error = %conveyor::Report(&error),
                    "cannot open a topology channel; trying again at the next declaration"
                ),
            }
        }
        done
    }

    /// A topology channel to replace one the broker closed, with the declarations made
    /// on the ones before it.
    pub(super) async fn next_topology_channel(&self) -> Result<Channel, LapinError> {
        let channel = self.open_channel("topology").await?;
        self.declare_again(channel).await
    }

    /// Declares on `channel`, a new topology channel, what was declared on the ones
    /// before it, so that it declares them again after a lost connection (see
    /// [`crate::redeclare`]). One the broker refuses now (declared otherwise since, or a
    /// binding whose exchange is gone) is dropped from the record with a warning; the
    /// refusal closed the channel, and lapin re-declares only what a channel itself
    /// declared, so the whole record goes again on a new one. A connection lost meanwhile
    /// ends it with the error, the record kept whole.
    pub(super) async fn declare_again(&self, mut channel: Channel) -> Result<Channel, LapinError> {
        'channel: loop {
            let declared = conveyor::kit::lock(&self.inner.topology_record).all();
            for declaration in declared {
                let Err(error) = declaration.declare(&channel).await else {
                    continue;
                };
                let status = channel.status();
                if status.connected()
                    || status.reconnecting()
                    || !self.inner.connection.status().connected()
                {
                    return Err(error);
                }
                tracing::warn!(
                    error = %conveyor::Report(&error),
                    "a declaration made earlier cannot be made again; it will not come back after a lost connection"
                );
                conveyor::kit::lock(&self.inner.topology_record).forget(&declaration);
                channel = self.open_channel("topology").await?;
                continue 'channel;
            }
            return Ok(channel);
        }
    }
}

/// Takes up to `max` messages from `queue` on `channel` (named `name` in errors), then
/// acks them all with one `basic.ack` (multiple).
async fn take(
    channel: &Channel,
    queue: ShortString,
    name: &str,
    max: usize,
) -> Result<Vec<DeadLetter>, LapinError> {
    let failed = |source: lapin::Error| {
        if is_not_found(&source) {
            LapinError::MissingQueue {
                queue: name.to_string(),
            }
        } else {
            LapinError::Receive {
                queue: name.to_string(),
                source,
            }
        }
    };
    let mut taken = Vec::new();
    let mut last = None;
    while taken.len() < max {
        let Some(message) = channel
            .basic_get(queue.clone(), BasicGetOptions { no_ack: false })
            .await
            .map_err(failed)?
        else {
            break;
        };
        let delivery = message.delivery;
        let headers = headers::received(&delivery.properties);
        let key = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(headers::partition_key);
        taken.push(DeadLetter::new(Bytes::from(delivery.data), headers, key));
        last = Some(delivery.acker);
    }
    if let Some(acker) = last {
        let acked = acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .map_err(failed)?;
        // Not sent: the channel failed (or was recovered) since the gets, and the broker
        // put the messages back. Taken they are not.
        if !acked {
            let state = lapin::ChannelState::Reconnecting;
            return Err(failed(
                lapin::ErrorKind::InvalidChannelState(state, "basic.ack").into(),
            ));
        }
    }
    Ok(taken)
}
