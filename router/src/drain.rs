//! The drain deadline as streams see it: when shutdown's drain deadline passes with
//! streams still open, each ends with an error event (`shutting_down`) instead of
//! stopping mid-sentence with no word of why.
//!
//! [`crate::serve`] runs every connection inside [`scope`] with a receiver that turns
//! `true` at the deadline; a stream made while handling a request on that connection
//! takes the receiver ([`current`]) and watches it beside its generations.

use std::future::Future;

use tokio::sync::watch;

tokio::task_local! {
    static DEADLINE_PASSED: watch::Receiver<bool>;
}

/// Runs `work` (one connection) with `passed` as the drain-deadline signal of the
/// streams it makes.
pub async fn scope<F: Future>(passed: watch::Receiver<bool>, work: F) -> F::Output {
    DEADLINE_PASSED.scope(passed, work).await
}

/// The drain-deadline signal of the connection being served, if it is served by
/// [`crate::serve`] (tests that call the app directly have none).
pub fn current() -> Option<watch::Receiver<bool>> {
    DEADLINE_PASSED.try_with(Clone::clone).ok()
}

/// Completes once `passed` turns `true`; never, if its sender is gone first.
pub async fn passed(passed: &mut watch::Receiver<bool>) {
    if passed.wait_for(|passed| *passed).await.is_err() {
        std::future::pending::<()>().await;
    }
}
