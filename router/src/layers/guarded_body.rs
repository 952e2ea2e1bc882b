//! A response body that keeps a value alive until the body is finished or
//! dropped, so that limits and metrics cover streamed responses to their end.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// `inner`, plus a `guard` dropped together with the body.
pub struct GuardedBody<G> {
    inner: Body,
    // Never read: its `Drop` is the point (permit release, metric recording).
    _guard: G,
}

impl<G: Send + Unpin + 'static> http_body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Makes `guard` live as long as `response`'s body.
pub fn guard_response<G: Send + Unpin + 'static>(response: Response, guard: G) -> Response {
    response.map(|inner| {
        Body::new(GuardedBody {
            inner,
            _guard: guard,
        })
    })
}
