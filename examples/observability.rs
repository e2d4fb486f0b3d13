//! Metrics on `/metrics` (Prometheus text), the health on `/health` and the lanes on
//! `/lanes`, next to a running service.
//!
//! Run with `cargo run --example observability`, then, from another shell:
//!
//! ```text
//! curl http://127.0.0.1:9464/metrics
//! curl http://127.0.0.1:9464/health
//! ```
//!
//! It handles 100 orders on four lanes and serves until Ctrl-C, or until its standard
//! input ends (`--port 0` picks a free port and prints it). The recorder is installed
//! before the app starts, since a mount registers its series as it starts. The HTTP side
//! is a few lines over a `TcpListener`, enough for a probe and a scrape; a service would
//! mount these routes on its own HTTP server (axum, hyper...).

use std::time::Duration;

use conveyor::{App, Json, MemoryBroker, Message, PartitionKey, Publisher, RunningApp};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Serialize, Deserialize)]
struct Order {
    id: u32,
}

async fn place(Json(order): Json<Order>, customer: PartitionKey) {
    // Stand-in for real work.
    tokio::time::sleep(Duration::from_millis(2)).await;
    if order.id % 25 == 0 {
        println!("{customer}: order {}", order.id);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = match std::env::args().skip_while(|a| a != "--port").nth(1) {
        Some(port) => port.parse()?,
        None => 9464,
    };
    let metrics = PrometheusBuilder::new().install_recorder()?;

    let broker = MemoryBroker::new();
    for id in 1..=100u32 {
        let customer = format!("customer-{}", id % 7);
        let message = Message::builder()
            .partition_key(customer)
            .json(&Order { id })?;
        broker.publish("orders", message).await?;
    }
    let app = App::new("orders")
        .mount(broker.queue("orders"), place, |m| m.workers(4).by_key())
        .start()
        .await?;

    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "serving http://{}/metrics and /health",
        listener.local_addr()?
    );

    let mut stdin = tokio::io::stdin();
    let mut sink = [0u8; 64];
    let stdin_closed = async move { while stdin.read(&mut sink).await.is_ok_and(|n| n > 0) {} };
    tokio::pin!(stdin_closed);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                if let Err(error) = serve(stream, &metrics, &app).await {
                    eprintln!("a request failed: {error}");
                }
            }
            () = conveyor::shutdown_signal() => break,
            () = &mut stdin_closed => break,
        }
    }
    app.shutdown().await?;
    Ok(())
}

/// Answers one HTTP/1.1 request, then closes the connection.
async fn serve(
    mut stream: TcpStream,
    metrics: &PrometheusHandle,
    app: &RunningApp,
) -> std::io::Result<()> {
    // The whole head, up to its empty line: a socket closed with unread bytes is reset,
    // and the client could lose the response.
    let mut reader = BufReader::new(&mut stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let mut header = String::new();
    while reader.read_line(&mut header).await? > 0 && !header.trim_end().is_empty() {
        header.clear();
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = match path {
        "/metrics" => ("200 OK", metrics.render()),
        "/health" => {
            let health = app.health();
            let status = if health.is_ready() {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let mounts: Vec<String> = health
                .mounts
                .iter()
                .map(|m| format!("{}: {:?}", m.queue, m.state))
                .chain(
                    health
                        .connections
                        .iter()
                        .map(|c| format!("connection {}: {:?}", c.name, c.state)),
                )
                .collect();
            let body = format!(
                "live: {}\nready: {}\n{}\n",
                health.is_live(),
                health.is_ready(),
                mounts.join("\n")
            );
            (status, body)
        }
        "/lanes" => ("200 OK", format!("{:#?}\n", app.lanes())),
        _ => (
            "404 Not Found",
            "try /metrics, /health or /lanes\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
