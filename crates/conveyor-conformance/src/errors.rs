//! A transport's errors say each cause once, however they are shown.

use std::sync::{Arc, Mutex};

use conveyor::{App, BoxError, Bytes, MemoryBroker, Message, State};

/// Panics if a part of `text` (between `: `) comes twice.
pub fn assert_says_each_part_once(label: &str, how: &str, text: &str) {
    let parts: Vec<&str> = text.split(": ").collect();
    for (i, part) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(part),
            "{label}, {how}: `{part}` comes twice in: {text}"
        );
    }
}

/// Each error `every` makes (its label, the error), alone and as the source of each core
/// error a transport wraps one in (`Subscribe`, `Publish`, `Refused`, `Transport`), each
/// under its label: for [`assert_each_cause_said_once`] (call it twice for `again`).
pub fn alone_and_wrapped<E>(every: impl Fn() -> Vec<(&'static str, E)>) -> Vec<(String, BoxError)>
where
    E: std::error::Error + Send + Sync + 'static,
{
    type Wrap = fn(BoxError) -> conveyor::Error;
    let ways: [(&str, Wrap); 4] = [
        ("Subscribe", |source| conveyor::Error::Subscribe {
            queue: "orders".into(),
            source,
        }),
        ("Publish", |source| conveyor::Error::Publish {
            destination: "orders".into(),
            source,
        }),
        ("Refused", |source| conveyor::Error::Refused {
            destination: "orders".into(),
            source,
        }),
        ("Transport", |source| conveyor::Error::Transport {
            transport: "a transport",
            source,
        }),
    ];
    let mut all: Vec<(String, BoxError)> = Vec::new();
    for (how, wrap) in ways {
        for (label, error) in every() {
            all.push((format!("{label} in {how}"), Box::new(wrap(Box::new(error)))));
        }
    }
    for (label, error) in every() {
        all.push((label.to_string(), Box::new(error)));
    }
    all
}

/// [`assert_each_cause_said_once`] of each error `every` makes, alone and wrapped in each
/// core error ([`alone_and_wrapped`]).
pub async fn assert_alone_and_wrapped_say_each_cause_once<E>(
    every: impl Fn() -> Vec<(&'static str, E)>,
) where
    E: std::error::Error + Send + Sync + 'static,
{
    let again = alone_and_wrapped(&every)
        .into_iter()
        .map(|(_, error)| error)
        .collect();
    assert_each_cause_said_once(alone_and_wrapped(&every), again).await;
}

/// An error and every one of its sources, joined by `: ` with nothing left out, as
/// anyhow's `{:#}`, eyre and `std::error::Report` show a chain.
pub fn chain_walked(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// Checks that each of `errors` (a label, and the error) follows the Rust error
/// convention and says every part once: by `Display`, by its chain walked through
/// `source()` as anyhow does ([`chain_walked`]), by [`conveyor::Report`], and as the
/// reason a handler's message is rejected with when the handler fails with it. `again` is
/// the same errors, made again in the same order (errors do not clone): the handlers
/// return those.
pub async fn assert_each_cause_said_once(errors: Vec<(String, BoxError)>, again: Vec<BoxError>) {
    assert_eq!(errors.len(), again.len(), "`again` is the same errors");
    for (label, error) in &errors {
        assert_says_each_part_once(label, "Display", &error.to_string());
        assert_says_each_part_once(label, "its sources walked", &chain_walked(error.as_ref()));
        let report = conveyor::Report(error.as_ref()).to_string();
        assert_says_each_part_once(label, "Report", &report);
    }

    // Each error returned by a handler for the message that names it.
    type Failing = Arc<Mutex<Vec<Option<BoxError>>>>;
    async fn fail(payload: Bytes, State(errors): State<Failing>) -> Result<(), BoxError> {
        let at: usize = std::str::from_utf8(&payload).unwrap().parse().unwrap();
        Err(errors.lock().unwrap()[at].take().expect("each error once"))
    }
    let again: Failing = Arc::new(Mutex::new(again.into_iter().map(Some).collect()));
    let broker = MemoryBroker::new();
    let app = App::new("errors")
        .with_state(again)
        .mount(broker.queue("failing"), fail, |m| m.reject_on_error());
    let test = conveyor::testing::TestApp::start(app, &broker)
        .await
        .unwrap();
    for at in 0..errors.len() {
        test.publish("failing", Message::new(at.to_string()))
            .await
            .unwrap();
    }
    test.settled().await.unwrap();
    let rejected = test.rejected("failing");
    assert_eq!(rejected.len(), errors.len());
    for rejected in rejected {
        let at: usize = std::str::from_utf8(&rejected.message.payload)
            .unwrap()
            .parse()
            .unwrap();
        assert_says_each_part_once(&errors[at].0, "as a reject reason", &rejected.reason);
    }
    test.stop().await.unwrap();
}
