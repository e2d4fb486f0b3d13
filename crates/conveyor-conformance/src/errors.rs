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
