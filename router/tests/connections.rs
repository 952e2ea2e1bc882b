//! The connection layer over real TCP (issue 17, cases 2 and 7): a header-read
//! timeout, a cap on open connections answered with 503 + Retry-After, and streams
//! cut at the drain deadline ending with an error event.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;
use support::sse_data;
use switchyard_router::fake::{FakeBackend, FAKE_MODEL};
use switchyard_router::{app, serve_with, AppState, RouterConfig, ServeOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

struct Server {
    address: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(fake: &FakeBackend, options: ServeOptions) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = app(AppState::new(
        Arc::new(fake.clone()),
        RouterConfig::default(),
    ));
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = tokio::spawn(serve_with(listener, app, shutdown, options));
    Server {
        address,
        stop,
        task,
    }
}

/// How long a read waits before the test calls the connection held forever: a guard
/// against a hang, far above what any step here takes (a loaded machine can stall a
/// thread for seconds), never the thing a test checks.
const HANG: Duration = Duration::from_secs(60);

/// Reads until the peer closes; what was read.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + HANG;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => all.extend_from_slice(&buffer[..n]),
            Err(_) => panic!("the connection stayed open {HANG:?}"),
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// `GET /health` on a new connection; the whole reply.
async fn health(address: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    read_to_close(&mut stream).await
}

/// Case 2: a client that sends its headers a byte at a time is cut off at the
/// header-read timeout (it held its connection forever before).
///
/// The timer starts after `started` (the server accepts after the connect), so the
/// cut comes at 300 ms or later on any machine; that it comes before the default
/// timeout (10 s) shows the configured one cut it. Neither bound can fail on a slow
/// machine short of a stall of 9.7 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    let fake = FakeBackend::default();
    let timeout = Duration::from_millis(300);
    let options = ServeOptions {
        header_read_timeout: timeout,
        ..ServeOptions::default()
    };
    let server = start(&fake, options).await;
    let started = Instant::now();
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHo")
        .await
        .unwrap();
    read_to_close(&mut stream).await;
    let held = started.elapsed();
    assert!(held >= timeout, "cut after {held:?}, before the timeout");
    assert!(
        held < ServeOptions::default().header_read_timeout,
        "held {held:?}: not by the configured timeout"
    );
    // A prompt client is served as before.
    assert!(health(server.address).await.starts_with("HTTP/1.1 200"));
    server.stop.send(()).unwrap();
    server.task.await.unwrap().unwrap();
}

/// Case 2: connections past the cap get a 503 with Retry-After at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_get_503_at_once() {
    let fake = FakeBackend::default();
    let options = ServeOptions {
        max_connections: 2,
        ..ServeOptions::default()
    };
    let server = start(&fake, options).await;
    // The server accepts in the order the connections completed (one accept loop
    // over the kernel's queue), so the two idle ones take the two places whenever
    // it gets to them.
    let _idle_1 = TcpStream::connect(server.address).await.unwrap();
    let _idle_2 = TcpStream::connect(server.address).await.unwrap();
    // At once: it is answered while the idle two still hold every place, so it
    // waited for no room (a connection left to wait would never be answered, and
    // `read_to_close` would call it held).
    let mut third = TcpStream::connect(server.address).await.unwrap();
    let reply = read_to_close(&mut third).await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains("retry-after: 1"), "{reply}");
    assert!(reply.contains("too_many_connections"), "{reply}");
    drop((_idle_1, _idle_2));
    // Room again once the server has seen them close (its connection tasks end on
    // their own time): retried until served, as a client told to retry would.
    let deadline = Instant::now() + HANG;
    loop {
        let reply = health(server.address).await;
        if reply.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
        assert!(
            Instant::now() < deadline,
            "no room {HANG:?} after they closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop.send(()).unwrap();
    server.task.await.unwrap().unwrap();
}

/// Case 7: a stream still open at the drain deadline ends with an error event
/// naming the shutdown (it just stopped before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_at_the_drain_deadline_ends_with_an_error_event() {
    let fake = FakeBackend::builder()
        .reply("one two three four five six seven eight")
        .token_delay(Duration::from_millis(400))
        .build();
    let options = ServeOptions {
        drain_deadline: Duration::from_millis(300),
        ..ServeOptions::default()
    };
    let server = start(&fake, options).await;
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", server.address))
        .json(&json!({"model": FAKE_MODEL, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    // The stream has started; now the server shuts down.
    let first = body.next().await.unwrap().unwrap();
    let mut text = String::from_utf8_lossy(&first).into_owned();
    server.stop.send(()).unwrap();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(chunk) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Err(_) => break,
        }
    }
    let data = sse_data(&text);
    let last: serde_json::Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "shutting_down", "{text}");
    assert!(!data.iter().any(|d| d == "[DONE]"));
    tokio::time::timeout(HANG, server.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
