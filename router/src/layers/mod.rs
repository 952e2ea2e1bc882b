//! The router's tower layers, one idea per file.
//!
//! Order in [`crate::app`], outermost first: request id → trace → request
//! metrics → origin check → (inference routes only) JSON body read, the one body
//! limit → timeout → load shedding.
//!
//! The router's own layers are tower services written out rather than
//! `axum::middleware::from_fn` functions: a `from_fn` middleware boxes the rest of the
//! stack again for every request, and its future (about a kilobyte) is too large for
//! the allocator's per-thread cache. These call the service they wrap directly and box
//! at most one small future.

pub mod api_key;
pub mod guarded_body;
pub mod json_body;
pub mod origin;
pub mod request_id;
pub mod request_metrics;
pub mod shed;
pub mod timeout;

use std::convert::Infallible;

use axum::extract::Request;
use axum::response::Response;
use tower::Service;

/// What the router's layers wrap: axum routes and handlers, and each other.
pub trait Inner:
    Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> Inner for S where
    S: Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + 'static
{
}
