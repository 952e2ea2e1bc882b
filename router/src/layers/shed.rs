//! Admission control: a bounded number of requests in flight, a bounded wait
//! queue, and 429 + `Retry-After` for everything beyond — never an unbounded
//! queue.
//!
//! A slot is held until the response body ends, so a long SSE stream counts
//! as in flight for its whole life.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::layers::guarded_body::guard_response;
use crate::layers::Inner;
use crate::metrics::HTTP_REQUESTS_SHED_TOTAL;

/// Slots for requests in flight and places in the queue for a slot.
#[derive(Debug)]
pub struct Admission {
    // The semaphore is FIFO, so queued requests are admitted in arrival order.
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
    max_in_flight: usize,
    max_queued: usize,
    retry_after: Duration,
}

impl Admission {
    /// `max_in_flight` slots (at least 1) and `max_queued` waiting places.
    pub fn new(max_in_flight: usize, max_queued: usize, retry_after: Duration) -> Self {
        let max_in_flight = max_in_flight.max(1);
        Admission {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            queued: AtomicUsize::new(0),
            max_in_flight,
            max_queued,
            retry_after,
        }
    }

    /// Takes a free slot, if there is one, without waiting.
    pub fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    /// Takes a slot, waiting in the queue if there is room; refuses otherwise.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        if let Some(permit) = self.try_admit() {
            return Ok(permit);
        }
        let reserved = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < self.max_queued).then_some(queued + 1)
            });
        if reserved.is_err() {
            metrics::counter!(HTTP_REQUESTS_SHED_TOTAL).increment(1);
            return Err(self.refusal());
        }
        // Leaves the queue on every path, including the client going away.
        let _place = QueuePlace(&self.queued);
        // The semaphore is never closed, so acquiring only fails if that changes.
        Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_closed| self.refusal())
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.slots.available_permits()
    }

    fn refusal(&self) -> ApiError {
        ApiError::TooManyRequests {
            in_flight: self.max_in_flight,
            queued: self.max_queued,
            retry_after: self.retry_after,
        }
    }
}

struct QueuePlace<'a>(&'a AtomicUsize);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Admits each request through an [`Admission`] or answers 429.
#[derive(Debug, Clone)]
pub struct ShedLayer {
    admission: Arc<Admission>,
}

impl ShedLayer {
    /// Admission through `admission`.
    pub fn new(admission: Arc<Admission>) -> Self {
        ShedLayer { admission }
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed {
            inner,
            admission: Arc::clone(&self.admission),
        }
    }
}

/// The service of [`ShedLayer`].
#[derive(Debug, Clone)]
pub struct Shed<S> {
    inner: S,
    admission: Arc<Admission>,
}

impl<S: Inner> Service<Request> for Shed<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // A free slot (the common case) admits at once and the request goes straight on.
        if let Some(permit) = self.admission.try_admit() {
            let response = self.inner.call(request);
            return Box::pin(async move { Ok(guard_response(response.await?, permit)) });
        }
        // The request waits for a slot: the service made ready is taken along and a
        // clone left in its place (tower's rule for services called later).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let admission = Arc::clone(&self.admission);
        Box::pin(async move {
            match admission.admit().await {
                Ok(permit) => Ok(guard_response(inner.call(request).await?, permit)),
                Err(refusal) => Ok(refusal.into_response()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn admits_up_to_the_limit_then_queues_then_refuses() {
        let admission = Admission::new(1, 1, Duration::from_secs(2));
        let first = admission.admit().await.unwrap();
        assert_eq!(admission.in_flight(), 1);

        let waiting = admission.admit();
        tokio::pin!(waiting);
        // One poll puts it in the queue; it cannot get a slot yet.
        assert!(tokio::time::timeout(Duration::ZERO, &mut waiting)
            .await
            .is_err());
        assert_eq!(admission.queued(), 1);

        let refused = admission.admit().await.unwrap_err();
        assert!(matches!(
            refused,
            ApiError::TooManyRequests {
                in_flight: 1,
                queued: 1,
                ..
            }
        ));
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(2)));

        drop(first);
        let second = waiting.await.unwrap();
        assert_eq!(admission.queued(), 0);
        assert_eq!(admission.in_flight(), 1);
        drop(second);
        assert_eq!(admission.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_zero_queue_refuses_as_soon_as_slots_are_full() {
        let admission = Admission::new(0, 0, Duration::from_secs(1));
        // At least one slot, whatever the configuration says.
        let _only = admission.admit().await.unwrap();
        assert!(admission.admit().await.is_err());
    }
}
