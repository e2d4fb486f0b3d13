//! Errors name what failed and never show a password.

use conveyor_redis::RedisBroker;

#[tokio::test]
async fn a_failed_connection_names_the_server_without_its_password() {
    // Nothing listens on port 1.
    let error = RedisBroker::connect("redis://app:s3cret@127.0.0.1:1")
        .await
        .expect_err("nothing listens there");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
}
