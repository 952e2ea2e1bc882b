//! Serving with graceful shutdown: stop accepting on a signal, let requests
//! in flight finish, but not for longer than a drain deadline.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// How long in-flight requests get to finish after shutdown begins.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// How often histogram buffers are drained while serving.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` completes, then drains for at
/// most [`DEFAULT_DRAIN_DEADLINE`].
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with_drain_deadline(listener, app, shutdown, DEFAULT_DRAIN_DEADLINE).await
}

/// Serves `app` on `listener` until `shutdown` completes; then stops
/// accepting, waits for open connections to finish, and returns once they
/// have or once `drain_deadline` has passed, whichever is first.
///
/// After the deadline, connections still open (long SSE streams) are
/// abandoned; they close when the runtime shuts down.
pub async fn serve_with_drain_deadline(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain_deadline: Duration,
) -> io::Result<()> {
    let upkeep = Metrics::global().spawn_upkeep(METRICS_UPKEEP_INTERVAL);
    let (draining_tx, draining_rx) = oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!(
            ?drain_deadline,
            "shutting down: no new connections, draining"
        );
        // The receiver is only gone if serving already ended.
        let _ = draining_tx.send(());
    };
    let server = axum::serve(listener, app).with_graceful_shutdown(signal);
    let deadline = async move {
        match draining_rx.await {
            Ok(()) => tokio::time::sleep(drain_deadline).await,
            // Serving ended on its own; the server branch wins the select.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let result = tokio::select! {
        result = server => result,
        () = deadline => {
            tracing::warn!(?drain_deadline, "drain deadline passed; abandoning open connections");
            Ok(())
        }
    };
    upkeep.abort();
    result
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
