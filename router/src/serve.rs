//! Serving connections: hyper's HTTP/1 with a header-read timeout, a cap on open
//! connections, and graceful shutdown (stop accepting on a signal, let requests in
//! flight finish, but not for longer than a drain deadline).
//!
//! A connection past the cap is answered at once with a 503 and `Retry-After` and
//! closed, so a flood of idle sockets neither exhausts file descriptors nor leaves
//! well-behaved clients hanging in the accept backlog. A client that sends its
//! headers slowly (one byte every few seconds) is cut off at the header-read timeout,
//! and one that stops reading its response at the write timeout.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::error::ErrorReply;
use crate::metrics::Metrics;
use crate::write_timeout::WriteTimeout;

/// How long in-flight requests get to finish after shutdown begins.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Default of [`ServeOptions::send_buffer_bytes`]: 128 KiB in flight once doubled,
/// a few megabytes a second at WAN round trips, far more than tokens stream at.
const DEFAULT_SEND_BUFFER: usize = 64 * 1024;

/// How often histogram buffers are drained while serving.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How long streams cut at the drain deadline get to send their error event.
const CUT_GRACE: Duration = Duration::from_millis(500);

/// Limits of the connection layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// How long open connections get after shutdown begins.
    pub drain_deadline: Duration,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// Connections open at once; beyond, 503 and close.
    pub max_connections: usize,
    /// The `Retry-After` of that 503, in seconds.
    pub retry_after_secs: u64,
    /// How long a client may leave a response unread before its connection is
    /// closed (its generation cancelled, its slot freed); see [`crate::write_timeout`].
    pub write_timeout: Duration,
    /// The kernel send buffer of each connection (the kernel doubles it), or `None`
    /// for the system's autotuning. Bounded by default: autotuning grows it to 4 MiB,
    /// which holds thousands of tokens a client never reads; until it is full the
    /// server cannot see that the client stopped (the write timeout starts then).
    pub send_buffer_bytes: Option<usize>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            retry_after_secs: 1,
            write_timeout: crate::write_timeout::DEFAULT_WRITE_TIMEOUT,
            send_buffer_bytes: Some(DEFAULT_SEND_BUFFER),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then drains for at
/// most [`DEFAULT_DRAIN_DEADLINE`].
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener, app, shutdown, ServeOptions::default()).await
}

/// [`serve`] with another drain deadline.
pub async fn serve_with_drain_deadline(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain_deadline: Duration,
) -> io::Result<()> {
    let options = ServeOptions {
        drain_deadline,
        ..ServeOptions::default()
    };
    serve_with(listener, app, shutdown, options).await
}

/// Serves `app` on `listener` until `shutdown` completes; then stops accepting, lets
/// open connections finish their requests, and returns once they have or once the
/// drain deadline has passed, whichever is first. Streams still open at the deadline
/// end with an error event (see [`crate::drain`]).
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    options: ServeOptions,
) -> io::Result<()> {
    let upkeep = Metrics::global().spawn_upkeep(METRICS_UPKEEP_INTERVAL);
    let max_connections = options.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let open = Arc::new(Semaphore::new(max_connections));
    let (closing, closing_rx) = watch::channel(false);
    let (deadline_passed, deadline_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        match Arc::clone(&open).try_acquire_owned() {
            Ok(permit) => {
                let connection = Connection {
                    app: app.clone(),
                    options,
                    closing: closing_rx.clone(),
                    _permit: permit,
                };
                tokio::spawn(drain_scope(deadline_rx.clone(), connection.run(stream)));
            }
            Err(_) => {
                tokio::spawn(refuse(stream, options.retry_after_secs));
            }
        }
    }
    drop(listener);
    let drain_deadline = options.drain_deadline;
    tracing::info!(
        ?drain_deadline,
        "shutting down: no new connections, draining"
    );
    let _ = closing.send(true);
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout(drain_deadline, open.acquire_many(all)).await;
    if drained.is_err() {
        tracing::warn!(
            ?drain_deadline,
            "drain deadline passed; ending open streams with an error event"
        );
        let _ = deadline_passed.send(true);
        let _ = tokio::time::timeout(CUT_GRACE, open.acquire_many(all)).await;
    }
    upkeep.abort();
    Ok(())
}

async fn drain_scope<F: Future>(passed: watch::Receiver<bool>, work: F) -> F::Output {
    crate::drain::scope(passed, work).await
}

/// One accepted connection and its place under the cap.
struct Connection {
    app: Router,
    options: ServeOptions,
    closing: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    async fn run(mut self, stream: TcpStream) {
        if let Some(bytes) = self.options.send_buffer_bytes {
            if let Err(error) = socket2::SockRef::from(&stream).set_send_buffer_size(bytes) {
                tracing::debug!(%error, "cannot set a connection's send buffer");
            }
        }
        let service = TowerToHyperService::new(self.app.clone());
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.options.header_read_timeout)
            .serve_connection(
                TokioIo::new(WriteTimeout::new(stream, self.options.write_timeout)),
                service,
            );
        tokio::pin!(connection);
        let result = tokio::select! {
            result = connection.as_mut() => result,
            () = crate::drain::passed(&mut self.closing) => {
                // Finish the request in progress, then close.
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(error) = result {
            tracing::debug!(%error, "connection ended with an error");
        }
    }
}

/// Answers a connection past the cap with a 503 and closes it.
async fn refuse(mut stream: TcpStream, retry_after_secs: u64) {
    // Written by hand on the raw socket (no HTTP service runs for it), with the body
    // of the one error mapping.
    let reply = ErrorReply::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "The server has too many open connections; retry shortly.".to_owned(),
        "too_many_connections",
    );
    let body = serde_json::to_string(reply.body()).unwrap_or_default();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {retry_after_secs}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// Completes on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
///
/// If a handler cannot be installed, that signal is logged and ignored, so
/// the server keeps running on the other one.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("received Ctrl-C"),
        () = terminate => tracing::info!("received SIGTERM"),
    }
}
