//! Keeping the broker's credentials out of lapin's TRACE output.
//!
//! At TRACE, lapin logs every frame its I/O loop writes (`lapin::io_loop`, "will write to
//! buffer"), the frames it discards on a poisoned channel (`lapin::frames`), and every
//! command its internal RPC handles (`lapin::internal_rpc`). Three of those can hold a
//! secret, printed as a list of bytes (`response: LongString([0, 117, 115, 101, 114,
//! ...])`):
//!
//! - `Connection.StartOk`: its `response` is the SASL response, `\0user\0password` for
//!   PLAIN (the default) and a table holding the password for AMQPLAIN;
//! - `Connection.SecureOk`: the answer to a challenge (`My password is ...` for
//!   RABBIT-CR-DEMO);
//! - `Connection.UpdateSecret` and lapin's `UpdateSecret` command: a refreshed token.
//!
//! The I/O loop runs on lapin's own thread, which logs through the *global* subscriber,
//! so a scoped one (`tracing::subscriber::with_default`) cannot filter it; and tracing's
//! `max_level_*` cargo features would silence TRACE for the whole application. Hence a
//! filter for the subscriber you install: `hide_credentials()` (with the
//! `tracing-filter` feature), or the [`HIDE_CREDENTIALS_DIRECTIVES`] for an `EnvFilter`.

/// [`EnvFilter`](https://docs.rs/tracing-subscriber/latest/tracing_subscriber/filter/struct.EnvFilter.html)
/// directives (for `RUST_LOG`, say) that turn off every lapin event that can print a
/// credential.
///
/// They match lapin's events by target and field name, so they also turn off the
/// frames and internal commands that hold no secret: every outgoing frame and every
/// internal RPC command disappears from lapin's TRACE output. The rest of it (incoming
/// frames, channel and consumer state, promises, I/O) stays. `hide_credentials()` (with
/// the `tracing-filter` feature) looks at each of those events instead, and keeps the
/// ones that hold no secret.
///
/// Add them to your own directives, in any order: each is more specific than a plain
/// `lapin=trace` or `lapin::io_loop=trace`, so it wins. One side effect: `EnvFilter`
/// matches field names on events only, so the `io_loop` span that lapin's I/O thread
/// runs in (target `lapin::io_loop`) is off too, and the lines of that thread lose its
/// name. In a shell, quote them for the brackets and braces:
///
/// ```text
/// RUST_LOG='info,lapin=trace,lapin::io_loop[{next_msg}]=off,lapin::frames[{frame}]=off,lapin::frames[{frames}]=off,lapin::internal_rpc[{command}]=off'
/// ```
///
/// Their targets are lapin's module paths, so a lapin release that moves these events
/// can bring a credential back; the `trace_redaction` test of this crate checks the
/// version in use.
///
/// ```
/// use tracing_subscriber::EnvFilter;
///
/// let filter = EnvFilter::new(format!(
///     "info,lapin=trace,{}",
///     conveyor_lapin::HIDE_CREDENTIALS_DIRECTIVES
/// ));
/// # let _ = filter;
/// ```
pub const HIDE_CREDENTIALS_DIRECTIVES: &str = "lapin::io_loop[{next_msg}]=off,\
     lapin::frames[{frame}]=off,\
     lapin::frames[{frames}]=off,\
     lapin::internal_rpc[{command}]=off";

#[cfg(feature = "tracing-filter")]
pub use filter::{HideCredentials, hide_credentials};

#[cfg(feature = "tracing-filter")]
mod filter {
    use std::fmt::{self, Write as _};

    use tracing::field::{Field, Visit};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata};
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::{Context, Filter};

    /// A filter that drops the lapin events that can print the broker's credentials, and
    /// keeps every other event, lapin's TRACE output included.
    ///
    /// Needs the `tracing-filter` feature. It is a per-layer filter:
    /// `fmt::layer().with_filter(hide_credentials())`; combine it with another filter
    /// through `FilterExt::and`, or filter the result again with `.with_filter(..)`. Give
    /// it to every layer that can see lapin's TRACE events, an exporter's (OpenTelemetry,
    /// say) included: it is `Copy`.
    ///
    /// What it drops, all at TRACE in lapin 4.12 (it does not look at the level, so that
    /// an event lapin moves to DEBUG stays covered):
    ///
    /// - outgoing frames (`lapin::io_loop`, the `next_msg` field) that can hold a secret:
    ///   `Connection.StartOk`, `SecureOk` and `UpdateSecret`, or any frame it does not
    ///   recognise. It keeps the rest: `Basic`, `Channel`, `Queue`, `Exchange`,
    ///   `Confirm`, `Tx` and `Access` methods, `Connection.TuneOk`, `Open`, `Close` and
    ///   `CloseOk`, content headers and bodies (printed without their content),
    ///   heartbeats and the protocol header;
    /// - lapin's internal RPC commands (`lapin::internal_rpc`, the `command` field) other
    ///   than the ones known to hold no secret: it drops `UpdateSecret` and any command
    ///   it does not know;
    /// - frames discarded on a poisoned channel (`lapin::frames`, the `frame` and
    ///   `frames` fields), all of them: they are rare, and one may be the login.
    ///
    /// Which events can print a secret is decided once per callsite, from its
    /// metadata (its target and field names), so other events cost nothing more. For
    /// the two callsites above that print one frame or one command, it reads the start
    /// of what the event would print (at most 64 bytes, then it stops formatting) and
    /// keeps the event when that start is on its list. It is a list of what is known to
    /// be safe, so a frame or command that a newer lapin or amq-protocol prints in
    /// another form is dropped rather than let through.
    ///
    /// It is not a [`Layer`](tracing_subscriber::Layer) (a filter for all layers at
    /// once): a layer that drops an event after reading its fields leaves the per-layer
    /// filters of the other layers in a wrong state (tracing-subscriber 0.3 does not
    /// reset it then).
    ///
    /// ```
    /// use tracing_subscriber::{EnvFilter, Layer, fmt, layer::SubscriberExt};
    ///
    /// // One layer, filtered by `RUST_LOG` and then by `hide_credentials`.
    /// let subscriber = tracing_subscriber::registry().with(
    ///     fmt::layer()
    ///         .with_filter(EnvFilter::from_default_env())
    ///         .with_filter(conveyor_lapin::hide_credentials()),
    /// );
    /// tracing::subscriber::set_global_default(subscriber).expect("no subscriber yet");
    /// ```
    #[derive(Clone, Copy, Debug, Default)]
    pub struct HideCredentials {
        _private: (),
    }

    /// The filter that drops the lapin events that can print the broker's credentials
    /// (see [`HideCredentials`]); add it when you turn TRACE on. Needs the
    /// `tracing-filter` feature.
    ///
    /// ```
    /// use tracing_subscriber::filter::{EnvFilter, FilterExt};
    /// use tracing_subscriber::{Layer, fmt, layer::SubscriberExt};
    ///
    /// let filter = EnvFilter::new("info,lapin=trace").and(conveyor_lapin::hide_credentials());
    /// let subscriber = tracing_subscriber::registry().with(fmt::layer().with_filter(filter));
    /// tracing::subscriber::set_global_default(subscriber).expect("no subscriber yet");
    /// ```
    pub fn hide_credentials() -> HideCredentials {
        HideCredentials::default()
    }

    /// What a callsite's events can print.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Callsite {
        /// Nothing secret.
        Safe,
        /// Frames that may be the login: every event is dropped.
        Frames,
        /// One outgoing frame, in the named field: each event is looked at.
        OutgoingFrame(&'static str),
        /// One internal RPC command, in the named field: each event is looked at.
        Command(&'static str),
    }

    const NEXT_MSG: &str = "next_msg";
    const COMMAND: &str = "command";

    /// Sorts a callsite by its target and field names. Any target under `lapin` counts,
    /// not just the modules that print these fields today, so that a field lapin moves to
    /// another module stays covered; the one known safe exception is the frames lapin
    /// receives (`lapin::channels`, "will handle frame"): the server sends no
    /// credential.
    fn callsite(meta: &Metadata<'_>) -> Callsite {
        let target = meta.target();
        if !meta.is_event() || !(target == "lapin" || target.starts_with("lapin::")) {
            return Callsite::Safe;
        }
        let fields = meta.fields();
        if fields.field(NEXT_MSG).is_some() {
            Callsite::OutgoingFrame(NEXT_MSG)
        } else if fields.field(COMMAND).is_some() {
            Callsite::Command(COMMAND)
        } else if target != "lapin::channels"
            && (fields.field("frame").is_some() || fields.field("frames").is_some())
        {
            Callsite::Frames
        } else {
            Callsite::Safe
        }
    }

    /// How amq-protocol prints the outgoing frames that hold no secret (`Display` of
    /// `AMQPFrame`: the method frames as `AMQPFrame::Method(<class>(<method>(..)))`).
    /// The `Connection` methods are listed one by one, as StartOk, SecureOk and
    /// UpdateSecret are the ones holding secrets.
    const SAFE_FRAMES: &[&str] = &[
        "AMQPFrame::ProtocolHeader(",
        "AMQPFrame::Header",
        "AMQPFrame::Body",
        "AMQPFrame::Heartbeat",
        "AMQPFrame::InvalidHeartbeat(",
        "AMQPFrame::Method(Basic(",
        "AMQPFrame::Method(Channel(",
        "AMQPFrame::Method(Queue(",
        "AMQPFrame::Method(Exchange(",
        "AMQPFrame::Method(Confirm(",
        "AMQPFrame::Method(Tx(",
        "AMQPFrame::Method(Access(",
        "AMQPFrame::Method(Connection(TuneOk(",
        "AMQPFrame::Method(Connection(Open(",
        "AMQPFrame::Method(Connection(Close(",
        "AMQPFrame::Method(Connection(CloseOk(",
    ];

    /// lapin's internal RPC commands that hold no secret (`InternalCommand` in lapin
    /// 4.12, all but `UpdateSecret`, which carries a new token).
    const SAFE_COMMANDS: &[&str] = &[
        "BasicAck",
        "BasicNack",
        "BasicReject",
        "CancelConsumer",
        "CloseChannel",
        "CloseConnection",
        "CreateChannel",
        "DeregisterConsumer",
        "FinishConnectionShutdown",
        "InitConnectionRecovery",
        "InitConnectionShutdown",
        "RemoveChannel",
        "SendConnectionCloseOk",
        "SendHeartbeat",
        "SetChannelStatus",
        "SetConnectionClosing",
        "SetConnectionClosed",
        "SetConnectionError",
        "Spawn",
        "StartChannelsRecovery",
        "StartHeartbeat",
    ];

    fn frame_is_safe(printed: &str) -> bool {
        SAFE_FRAMES.iter().any(|safe| printed.starts_with(safe))
    }

    fn command_is_safe(printed: &str) -> bool {
        // `Debug` of an enum starts with the variant's name, followed by `(` for one
        // with fields.
        let name_end = printed
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(printed.len());
        let (name, rest) = printed.split_at(name_end);
        (rest.is_empty() || rest.starts_with('(')) && SAFE_COMMANDS.contains(&name)
    }

    /// Whether this event keeps its place: looks at most at the start of one field.
    fn event_is_safe(event: &Event<'_>) -> bool {
        match callsite(event.metadata()) {
            Callsite::Safe => true,
            Callsite::Frames => false,
            Callsite::OutgoingFrame(field) => {
                printed_start(event, field).is_some_and(|start| frame_is_safe(start.as_str()))
            }
            Callsite::Command(field) => {
                printed_start(event, field).is_some_and(|start| command_is_safe(start.as_str()))
            }
        }
    }

    /// The start of what `field` of `event` prints, or `None` when it has no such field.
    fn printed_start(event: &Event<'_>, field: &'static str) -> Option<Start> {
        let mut visitor = StartOf { field, start: None };
        event.record(&mut visitor);
        visitor.start
    }

    /// The first [`Start::LEN`] bytes something prints. Writing more fails, which stops
    /// the formatting there: a frame with a large table is not printed in full for
    /// nothing.
    struct Start {
        bytes: [u8; Start::LEN],
        len: usize,
    }

    impl Start {
        /// Enough for the longest entry of [`SAFE_FRAMES`] and [`SAFE_COMMANDS`].
        const LEN: usize = 64;

        fn of(value: &dyn fmt::Debug) -> Start {
            let mut start = Start {
                bytes: [0; Start::LEN],
                len: 0,
            };
            // An error here is this writer saying it is full: what it holds is all the
            // checks need.
            let _ = write!(start, "{value:?}");
            start
        }

        fn as_str(&self) -> &str {
            let bytes = &self.bytes[..self.len];
            // The cut may fall inside a character: keep what comes before it.
            match std::str::from_utf8(bytes) {
                Ok(text) => text,
                Err(error) => std::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or(""),
            }
        }
    }

    impl fmt::Write for Start {
        fn write_str(&mut self, text: &str) -> fmt::Result {
            let taken = text.len().min(Start::LEN - self.len);
            self.bytes[self.len..self.len + taken].copy_from_slice(&text.as_bytes()[..taken]);
            self.len += taken;
            if self.len == Start::LEN {
                Err(fmt::Error)
            } else {
                Ok(())
            }
        }
    }

    /// Reads the start of one field of an event.
    struct StartOf {
        field: &'static str,
        start: Option<Start>,
    }

    impl Visit for StartOf {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            // lapin records `%frame` (Display) and `?command` (Debug) fields; both come
            // here, a Display one wrapped so that `{:?}` prints its Display form.
            if field.name() == self.field {
                self.start = Some(Start::of(value));
            }
        }

        fn record_str(&mut self, field: &Field, value: &str) {
            // As the formatting layers print a string field: without quotes.
            if field.name() == self.field {
                self.start = Some(Start::of(&format_args!("{value}")));
            }
        }
    }

    impl<S> Filter<S> for HideCredentials {
        fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
            callsite(meta) != Callsite::Frames
        }

        fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
            // Cached by tracing per callsite: the events of a never callsite are not even
            // built, those of an always one are not looked at. The two callsites read in
            // `event_enabled` must be sometimes: tracing-subscriber expects `enabled` to
            // run before a per-layer filter drops an event there (a debug assertion
            // fails otherwise).
            match callsite(meta) {
                Callsite::Safe => Interest::always(),
                Callsite::Frames => Interest::never(),
                Callsite::OutgoingFrame(_) | Callsite::Command(_) => Interest::sometimes(),
            }
        }

        fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
            event_is_safe(event)
        }

        fn max_level_hint(&self) -> Option<LevelFilter> {
            // Every level passes. `Some(TRACE)` rather than `None` ("no idea"), so that
            // `hide_credentials().and(other)` keeps the other filter's hint.
            Some(LevelFilter::TRACE)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        use std::io;
        use std::sync::{Arc, Mutex};

        use lapin::protocol::{AMQPClass, basic, connection};
        use lapin::types::{FieldTable, LongString};
        use tracing_subscriber::Layer;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::{EnvFilter, fmt};

        /// What amq-protocol prints for an outgoing method frame (its `Display`).
        fn printed(class: AMQPClass) -> String {
            format!("AMQPFrame::Method({class:?})")
        }

        fn start_ok() -> AMQPClass {
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties: FieldTable::default(),
                mechanism: "PLAIN".into(),
                response: LongString::from("\0user\0s3cret"),
                locale: "en_US".into(),
            }))
        }

        #[test]
        fn the_frames_holding_secrets_are_not_safe() {
            assert!(!frame_is_safe(&printed(start_ok())));
            let secure_ok =
                AMQPClass::Connection(connection::AMQPMethod::SecureOk(connection::SecureOk {
                    response: LongString::from("My password is s3cret"),
                }));
            assert!(!frame_is_safe(&printed(secure_ok)));
            let update = AMQPClass::Connection(connection::AMQPMethod::UpdateSecret(
                connection::UpdateSecret {
                    new_secret: LongString::from("t0ken"),
                    reason: "refresh".into(),
                },
            ));
            assert!(!frame_is_safe(&printed(update)));
            assert!(!frame_is_safe("something new"));
        }

        #[test]
        fn the_other_frames_are_safe() {
            let publish = AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "".into(),
                routing_key: "orders".into(),
                mandatory: true,
                immediate: false,
            }));
            assert!(frame_is_safe(&printed(publish)));
            let open = AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: "/".into(),
            }));
            assert!(frame_is_safe(&printed(open)));
            let close_ok =
                AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {}));
            assert!(frame_is_safe(&printed(close_ok)));
            for frame in [
                "AMQPFrame::Header",
                "AMQPFrame::Body",
                "AMQPFrame::Heartbeat",
            ] {
                assert!(frame_is_safe(frame), "{frame}");
            }
        }

        #[test]
        fn only_known_commands_are_safe() {
            assert!(command_is_safe("SendHeartbeat"));
            assert!(command_is_safe(
                "BasicAck(1, 2, BasicAckOptions { multiple: false }, ..)"
            ));
            assert!(!command_is_safe(
                "UpdateSecret(LongString([116]), \"refresh\", ..)"
            ));
            assert!(!command_is_safe("SendHeartbeatWithSecret(..)"));
            assert!(!command_is_safe(""));
        }

        #[test]
        fn the_start_stops_at_its_length() {
            let long = "x".repeat(1000);
            let start = Start::of(&format_args!("{long}"));
            assert_eq!(start.as_str().len(), Start::LEN);
            // A multi-byte character across the cut is left out.
            let text = format!("{}é", "x".repeat(Start::LEN - 1));
            assert_eq!(
                Start::of(&format_args!("{text}")).as_str(),
                "x".repeat(Start::LEN - 1)
            );
        }

        /// A writer into a shared buffer, for the fmt layers below.
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);

        impl Buffer {
            fn text(&self) -> String {
                String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
            }
        }

        impl io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }

            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }

        /// The events lapin emits, from callsites with its targets and field names.
        fn emit_lapin_like_events() {
            let login = printed(start_ok());
            let publish = "AMQPFrame::Method(Basic(Publish(Publish { .. })))";
            tracing::trace!(target: "lapin::io_loop", next_msg = %login, "will write to buffer");
            tracing::trace!(target: "lapin::io_loop", next_msg = %publish, "will write to buffer");
            tracing::trace!(target: "lapin::io_loop", "wrote {} bytes", 42);
            tracing::trace!(target: "lapin::frames", frame = ?login, "Discarding frame because of poisoning");
            tracing::trace!(target: "lapin::internal_rpc", command = ?"UpdateSecret(t0ken)", "Handling internal RPC command");
            tracing::trace!(target: "lapin::internal_rpc", command = %"SendHeartbeat", "Handling internal RPC command");
            tracing::trace!(target: "lapin::channels", frame = %"AMQPFrame::Method(Connection(Start(..)))", "will handle frame");
            tracing::trace!(target: "my_app", next_msg = %"my own", "not lapin's");
        }

        impl<'a> fmt::MakeWriter<'a> for Buffer {
            type Writer = Buffer;

            fn make_writer(&'a self) -> Buffer {
                self.clone()
            }
        }

        /// A fmt layer writing to `buffer`, without colours.
        fn fmt_layer<S>(
            buffer: &Buffer,
        ) -> fmt::Layer<S, fmt::format::DefaultFields, fmt::format::Format, Buffer> {
            fmt::layer().with_ansi(false).with_writer(buffer.clone())
        }

        fn assert_filtered(output: &str) {
            // The password, as a list of bytes (the LongString) or as text.
            assert!(!output.contains("115, 51, 99, 114, 101, 116"), "{output}");
            assert!(!output.contains("s3cret"), "{output}");
            assert!(!output.contains("t0ken"), "{output}");
            assert!(!output.contains("Discarding frame"), "{output}");
            assert!(output.contains("Publish"), "{output}");
            assert!(output.contains("wrote 42 bytes"), "{output}");
            assert!(output.contains("SendHeartbeat"), "{output}");
            assert!(output.contains("will handle frame"), "{output}");
            assert!(output.contains("not lapin's"), "{output}");
        }

        #[test]
        fn as_a_per_layer_filter_it_drops_only_the_secrets() {
            let (filtered, raw) = (Buffer::default(), Buffer::default());
            let subscriber = tracing_subscriber::registry()
                .with(fmt_layer(&filtered).with_filter(hide_credentials()))
                .with(fmt_layer(&raw));
            tracing::subscriber::with_default(subscriber, emit_lapin_like_events);
            assert_filtered(&filtered.text());
            // The same events, unfiltered, show the password.
            assert!(
                raw.text().contains("115, 51, 99, 114, 101, 116"),
                "{}",
                raw.text()
            );
        }

        #[test]
        fn combined_with_another_filter_it_still_drops_the_secrets() {
            use tracing_subscriber::filter::FilterExt;

            let buffer = Buffer::default();
            let filter = EnvFilter::new("trace").and(hide_credentials());
            let subscriber =
                tracing_subscriber::registry().with(fmt_layer(&buffer).with_filter(filter));
            tracing::subscriber::with_default(subscriber, emit_lapin_like_events);
            assert_filtered(&buffer.text());
        }

        #[test]
        fn the_env_filter_directives_drop_every_outgoing_frame_and_command() {
            let buffer = Buffer::default();
            let filter = EnvFilter::new(format!(
                "trace,lapin::io_loop=trace,{}",
                crate::HIDE_CREDENTIALS_DIRECTIVES
            ));
            let subscriber =
                tracing_subscriber::registry().with(fmt_layer(&buffer).with_filter(filter));
            tracing::subscriber::with_default(subscriber, emit_lapin_like_events);
            let output = buffer.text();
            assert!(!output.contains("115, 51, 99, 114, 101, 116"), "{output}");
            assert!(!output.contains("t0ken"), "{output}");
            assert!(!output.contains("Publish"), "{output}");
            assert!(!output.contains("SendHeartbeat"), "{output}");
            assert!(output.contains("wrote 42 bytes"), "{output}");
            assert!(output.contains("will handle frame"), "{output}");
            assert!(output.contains("not lapin's"), "{output}");
        }
    }
}
