use amq_protocol::{
    frame::AMQPFrame,
    protocol::{AMQPClass, connection},
};
use std::fmt;

/// A frame, a list of frames or an internal command as the logs print it: as it prints
/// itself, except that the credentials it carries are printed as `***`.
///
/// The credentials are the ones a client sends: the SASL response of
/// `connection.start-ok` (`\0user\0password` for PLAIN, a table holding the password for
/// AMQPLAIN) and of `connection.secure-ok`, and the new secret of
/// `connection.update-secret` (and of the internal command that sends it).
pub(crate) struct Redacted<'a, T: ?Sized>(pub(crate) &'a T);

/// What is printed in place of a credential.
pub(crate) struct Hidden;

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Redacted<'_, AMQPFrame> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            AMQPFrame::Method(_, class) => {
                f.write_fmt(format_args!("AMQPFrame::Method({:?})", Redacted(class)))
            }
            frame => fmt::Display::fmt(frame, f),
        }
    }
}

impl fmt::Debug for Redacted<'_, AMQPFrame> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            AMQPFrame::Method(channel_id, class) => f
                .debug_tuple("Method")
                .field(channel_id)
                .field(&Redacted(class))
                .finish(),
            frame => fmt::Debug::fmt(frame, f),
        }
    }
}

impl fmt::Debug for Redacted<'_, [AMQPFrame]> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter().map(Redacted)).finish()
    }
}

impl fmt::Debug for Redacted<'_, AMQPClass> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            AMQPClass::Connection(method) => f
                .debug_tuple("Connection")
                .field(&Redacted(method))
                .finish(),
            class => fmt::Debug::fmt(class, f),
        }
    }
}

impl fmt::Debug for Redacted<'_, connection::AMQPMethod> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            connection::AMQPMethod::StartOk(method) => f
                .debug_tuple("StartOk")
                .field(&Redacted(method))
                .finish(),
            connection::AMQPMethod::SecureOk(method) => f
                .debug_tuple("SecureOk")
                .field(&Redacted(method))
                .finish(),
            connection::AMQPMethod::UpdateSecret(method) => f
                .debug_tuple("UpdateSecret")
                .field(&Redacted(method))
                .finish(),
            method => fmt::Debug::fmt(method, f),
        }
    }
}

impl fmt::Debug for Redacted<'_, connection::StartOk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StartOk")
            .field("client_properties", &self.0.client_properties)
            .field("mechanism", &self.0.mechanism)
            .field("response", &Hidden)
            .field("locale", &self.0.locale)
            .finish()
    }
}

impl fmt::Debug for Redacted<'_, connection::SecureOk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecureOk")
            .field("response", &Hidden)
            .finish()
    }
}

impl fmt::Debug for Redacted<'_, connection::UpdateSecret> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpdateSecret")
            .field("new_secret", &Hidden)
            .field("reason", &self.0.reason)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::protocol::basic;
    use amq_protocol::types::{FieldTable, LongString};

    fn method(method: connection::AMQPMethod) -> AMQPFrame {
        AMQPFrame::Method(0, AMQPClass::Connection(method))
    }

    fn start_ok() -> AMQPFrame {
        method(connection::AMQPMethod::StartOk(connection::StartOk {
            client_properties: FieldTable::default(),
            mechanism: "PLAIN".into(),
            response: LongString::from("\0user\0s3cret"),
            locale: "en_US".into(),
        }))
    }

    fn printed(frame: &AMQPFrame) -> [String; 3] {
        [
            format!("{}", Redacted(frame)),
            format!("{:?}", Redacted(frame)),
            format!("{:#?}", Redacted(frame)),
        ]
    }

    #[test]
    fn credentials_are_hidden() {
        let secure_ok = method(connection::AMQPMethod::SecureOk(connection::SecureOk {
            response: LongString::from("My password is s3cret"),
        }));
        let update_secret = method(connection::AMQPMethod::UpdateSecret(connection::UpdateSecret {
            new_secret: LongString::from("s3cret"),
            reason: "refresh".into(),
        }));
        for frame in [start_ok(), secure_ok, update_secret] {
            for printed in printed(&frame) {
                assert!(!printed.contains("s3cret"), "{printed}");
                // "s3cret" as amq-protocol prints a `LongString`
                assert!(!printed.contains("115, 51, 99, 114, 101, 116"), "{printed}");
                assert!(printed.contains("***"), "{printed}");
            }
        }
    }

    #[test]
    fn the_rest_prints_as_before() {
        let [display, debug, _] = printed(&start_ok());
        assert_eq!(
            display,
            "AMQPFrame::Method(Connection(StartOk(StartOk { client_properties: FieldTable({}), mechanism: ShortString(\"PLAIN\"), response: ***, locale: ShortString(\"en_US\") })))"
        );
        assert_eq!(
            debug,
            "Method(0, Connection(StartOk(StartOk { client_properties: FieldTable({}), mechanism: ShortString(\"PLAIN\"), response: ***, locale: ShortString(\"en_US\") })))"
        );
        let publish = AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: "".into(),
            routing_key: "orders".into(),
            mandatory: true,
            immediate: false,
        })));
        let open = method(connection::AMQPMethod::Open(connection::Open {
            virtual_host: "/".into(),
        }));
        for frame in [publish, open, AMQPFrame::Heartbeat, AMQPFrame::Body(1, b"hello".to_vec())] {
            assert_eq!(format!("{}", Redacted(&frame)), format!("{frame}"));
            assert_eq!(format!("{:?}", Redacted(&frame)), format!("{frame:?}"));
            assert_eq!(format!("{:#?}", Redacted(&frame)), format!("{frame:#?}"));
        }
        let frames = [start_ok(), AMQPFrame::Heartbeat];
        assert_eq!(
            format!("{:?}", Redacted(&frames[..])),
            format!("[{:?}, Heartbeat]", Redacted(&frames[0]))
        );
    }
}
