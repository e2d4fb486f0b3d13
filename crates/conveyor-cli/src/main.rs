//! `conveyor`: see and repair the queues of a Conveyor service from the shell, on
//! RabbitMQ, SQS, NATS JetStream or Redis Streams.
//!
//! ```text
//! conveyor --broker amqp://guest:guest@127.0.0.1:5672 depth orders orders-dead --watch
//! conveyor --broker sqs://us-east-1 peek orders-dead -n 5
//! conveyor --broker amqp://127.0.0.1 publish orders --key alice --header x-tenant=acme order.json
//! conveyor --broker nats://127.0.0.1:4222 redrive orders-dead --to orders --filter x-tenant=acme
//! conveyor --broker redis://127.0.0.1:6379 peek orders-dead -n 5
//! ```
//!
//! The broker comes from `--broker` or `CONVEYOR_BROKER`: `amqp://…` or `amqps://…` for
//! RabbitMQ, `sqs://region[/endpoint]` for SQS with the standard AWS credential chain,
//! `nats://[user:password@]host:port` (or `nats://token@host:port`) for NATS JetStream,
//! `redis://[[user]:password@]host:port[/db]` for Redis Streams (`rediss://`, TLS, is
//! refused: the Redis transport is built without TLS).
//! Every failure is one line on standard error and a non-zero exit code; a password in a
//! URL is never printed. Standard output closed by its reader (`| head`) ends the command
//! early, with what it held handed back, and exits 0 without a word.

mod depth;
mod interrupt;
mod out;
mod pass;
mod peek;
mod publish;
mod redrive;
mod reported;
mod show;
mod target;

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use target::{Inspect, Target};

/// See and repair the queues of a Conveyor service, on RabbitMQ, SQS, NATS JetStream or
/// Redis Streams.
#[derive(Debug, Parser)]
#[command(name = "conveyor", version)]
struct Cli {
    /// The broker: amqp://user:password@host:port/vhost, amqps://…,
    /// sqs://region[/endpoint] (credentials from the standard AWS chain),
    /// nats://host:port or nats://user:password@host:port (NATS JetStream), or
    /// redis://host:port/db or redis://user:password@host:port/db (Redis Streams; the
    /// user, or the /db, may be left out; not rediss://, TLS).
    #[arg(long, env = "CONVEYOR_BROKER", hide_env_values = true, global = true)]
    broker: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Prints how many messages each queue holds: ready, in flight and delayed ("-"
    /// where the broker does not say).
    ///
    /// On NATS, IN FLIGHT also counts the messages handed back (nak'ed, by a peek say)
    /// and not yet acknowledged: JetStream counts them as pending acknowledgement.
    ///
    /// On Redis, READY counts the entries never delivered and those whose lease lapsed
    /// or that were handed back (claimable at once), IN FLIGHT those leased, DELAYED
    /// those waiting out a delay; a queue is there if its stream is.
    Depth {
        /// The queues.
        #[arg(required = true)]
        queues: Vec<String>,
        /// Refreshes the figures in place every SECONDS (2 by default) until interrupted.
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
        watch: Option<f64>,
    },
    /// Shows the messages ready in a queue without consuming them: each is received,
    /// shown, and handed back once all are shown.
    ///
    /// On NATS that is a fetch, then a nak: JetStream delivers the messages again at
    /// once (each peek counts as a delivery), and `depth` counts them in flight from
    /// then on, until they are acknowledged. Peek and redrive so count the ready and the
    /// in-flight messages of a NATS queue as what they can receive.
    ///
    /// On Redis each message is read (or claimed) for this command's consumer in the
    /// queue's consumer group, then handed back claimable at once: `depth` counts it
    /// ready again, and each peek counts as a delivery.
    Peek {
        /// The queue.
        queue: String,
        /// How many messages to show at most.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: usize,
    },
    /// Publishes a message read from FILE (or standard input), or one per line with
    /// --lines; each is confirmed by the broker before the command ends. The queue must
    /// exist: a publish declares nothing.
    ///
    /// On NATS, where JetStream would make the stream of a subject no stream takes, and
    /// on Redis, where `XADD` would make the stream, the queue is looked up first, and
    /// nothing is sent to one that does not exist.
    Publish {
        /// The queue.
        queue: String,
        /// The partition key (on SQS, a FIFO queue's message group; refused for a
        /// standard SQS queue, which would drop it).
        #[arg(long)]
        key: Option<String>,
        /// A header, as name=value; may be repeated.
        #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
        headers: Vec<(String, String)>,
        /// The content type; by default application/json when the body is JSON, none
        /// otherwise.
        #[arg(long)]
        content_type: Option<String>,
        /// One message per line of the input (empty lines skipped).
        #[arg(long)]
        lines: bool,
        /// The file to read; standard input when absent or `-`.
        file: Option<PathBuf>,
    },
    /// Moves dead letters back to a queue: each is published and confirmed before it is
    /// removed from the dead-letter queue, so an interrupted redrive loses nothing and,
    /// interrupted by Ctrl-C or SIGTERM, moves nothing twice.
    Redrive {
        /// The dead-letter queue.
        dead_letter_queue: String,
        /// Where the messages go.
        #[arg(long = "to", value_name = "QUEUE")]
        to: String,
        /// Moves only messages with this header value, as name=value (the others stay).
        #[arg(long, value_name = "NAME=VALUE", value_parser = parse_header)]
        filter: Option<(String, String)>,
        /// Moves at most N messages.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
        /// Shows what would move, and moves nothing.
        #[arg(long)]
        dry_run: bool,
        /// Moves at most N messages a second, to spare the consumers of the target.
        #[arg(long, value_name = "N")]
        rate: Option<f64>,
    },
}

/// A command that failed: one line for standard error, and the exit code.
#[derive(Debug)]
pub struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    /// The command line or its input was wrong (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            code: 2,
        }
    }

    /// The broker refused or could not be reached (exit code 1).
    pub fn broker(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            code: 1,
        }
    }

    /// A broker call about `what` failed with `error`.
    pub fn call(what: &str, error: &conveyor::Error) -> Self {
        Failure::broker(format!("{what}: {}", conveyor::Report(error)))
    }

    /// Standard output was closed by its reader (`| head`): the command stops early, hands
    /// back what it holds, and exits 0 without a word, as it would had the reader read on.
    pub fn output_closed() -> Self {
        Failure {
            message: String::new(),
            code: 0,
        }
    }

    /// Whether this is `output_closed`: nothing to say, and exit code 0.
    pub fn is_output_closed(&self) -> bool {
        self.code == 0
    }

    /// Interrupted before the work was done (exit code 130, as a shell reports SIGINT).
    pub fn interrupted(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            code: 130,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("`{text}` is not NAME=VALUE")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&Failure::broker(format!("cannot start: {error}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(&failure),
    }
}

fn fail(failure: &Failure) -> ExitCode {
    if failure.is_output_closed() {
        return ExitCode::SUCCESS;
    }
    // One line, whatever the causes said; written so that a closed stderr cannot panic.
    let line = failure.message.replace('\n', " ");
    let _ = writeln!(std::io::stderr(), "conveyor: error: {line}");
    ExitCode::from(failure.code)
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let reported = reported::Reported::install();
    let result = connect_and_run(cli).await;
    match (result, reported.first()) {
        (Ok(()), Some(report)) => Err(Failure::broker(format!(
            "the work is done, but Conveyor reported an error on the way: {report}"
        ))),
        // Stopped early for a closed output: quiet only if the hand-back went well.
        (Err(failure), Some(report)) if failure.is_output_closed() => {
            Err(Failure::broker(format!(
                "standard output was closed, and Conveyor reported an error on the way: {report}"
            )))
        }
        (result, _) => result,
    }
}

async fn connect_and_run(cli: Cli) -> Result<(), Failure> {
    let Some(url) = cli.broker else {
        return Err(Failure::usage(
            "no broker: give --broker URL or set CONVEYOR_BROKER",
        ));
    };
    match Target::parse(&url)? {
        Target::Amqp(url) => on(Target::rabbitmq(&url).await?, cli.command).await,
        Target::Sqs { region, endpoint } => {
            on(
                Target::sqs(&region, endpoint.as_deref()).await?,
                cli.command,
            )
            .await
        }
        Target::Nats(url) => on(Target::nats(&url).await?, cli.command).await,
        Target::Redis(url) => on(Target::redis(&url).await?, cli.command).await,
    }
}

/// Runs `command` on `broker`, then closes it (which flushes what was settled).
async fn on<B: Inspect>(broker: B, command: Command) -> Result<(), Failure> {
    let result = match command {
        Command::Depth { queues, watch } => {
            let every = watch.map(Duration::try_from_secs_f64).transpose();
            let every =
                every.map_err(|_| Failure::usage("--watch takes a positive number of seconds"))?;
            depth::run(&broker, &queues, every).await
        }
        Command::Peek { queue, count } => peek::run(&broker, &queue, count).await,
        Command::Publish {
            queue,
            key,
            headers,
            content_type,
            lines,
            file,
        } => {
            let input = publish::Input {
                key,
                headers,
                content_type,
                lines,
                file,
            };
            publish::run(&broker, &queue, input).await
        }
        Command::Redrive {
            dead_letter_queue,
            to,
            filter,
            limit,
            dry_run,
            rate,
        } => {
            let pause = rate.map(|rate| Duration::try_from_secs_f64(1.0 / rate));
            let pause = match pause {
                None => None,
                Some(Ok(pause)) if !pause.is_zero() => Some(pause),
                Some(_) => {
                    return Err(Failure::usage(
                        "--rate takes a positive number of messages a second, at most a billion",
                    ));
                }
            };
            let plan = redrive::Plan {
                from: dead_letter_queue,
                to,
                filter,
                limit,
                dry_run,
                pause,
            };
            redrive::run(&broker, &plan).await
        }
    };
    let closed = broker
        .close()
        .await
        .map_err(|error| Failure::call("closing the broker connection", &error));
    match (result, closed) {
        // A closed output says nothing: a failed close must not go unsaid behind it.
        (Err(failure), Err(closed)) if failure.is_output_closed() => Err(closed),
        (result, closed) => result.and(closed),
    }
}
