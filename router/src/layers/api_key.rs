//! `--api-key`: a shared key for deployments without tenants (as vLLM's and
//! llama-server's `--api-key`). Requests under `/v1/` without
//! `Authorization: Bearer KEY` for one of the keys get an OpenAI-shaped 401;
//! the probes (`/health`, `/ready`) and `/metrics` stay open for the
//! orchestrator. Keys are compared by SHA-256 digest in constant time, so a
//! timing side channel does not give away a key's prefix.
//!
//! ```
//! use switchyard_router::layers::api_key::ApiKeyLayer;
//! let layer = ApiKeyLayer::new(["sk-local-1".to_string()]);
//! assert!(layer.accepts("Bearer sk-local-1"));
//! assert!(!layer.accepts("Bearer sk-local-2"));
//! ```

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::{Either, Ready};
use http::header::AUTHORIZATION;
use http::StatusCode;
use switchyard_policies::{digests_equal, key_digest, KeyDigest};
use tower::{Layer, Service};

use crate::error::ErrorReply;

/// Requires one of the keys on `/v1/` requests.
#[derive(Clone)]
pub struct ApiKeyLayer {
    keys: Arc<[KeyDigest]>,
}

impl ApiKeyLayer {
    pub fn new(keys: impl IntoIterator<Item = String>) -> Self {
        ApiKeyLayer {
            keys: keys.into_iter().map(|key| key_digest(&key)).collect(),
        }
    }

    /// Whether an `Authorization` header value carries one of the keys.
    pub fn accepts(&self, authorization: &str) -> bool {
        let Some(key) = authorization
            .strip_prefix("Bearer ")
            .or_else(|| authorization.strip_prefix("bearer "))
        else {
            return false;
        };
        let given = key_digest(key.trim());
        // Every key compared, so the time does not say which one matched.
        self.keys
            .iter()
            .fold(false, |found, key| digests_equal(key, &given) | found)
    }
}

impl<S> Layer<S> for ApiKeyLayer {
    type Service = ApiKey<S>;

    fn layer(&self, inner: S) -> ApiKey<S> {
        ApiKey {
            inner,
            keys: self.clone(),
        }
    }
}

/// The service of [`ApiKeyLayer`].
#[derive(Clone)]
pub struct ApiKey<S> {
    inner: S,
    keys: ApiKeyLayer,
}

impl<S> Service<Request> for ApiKey<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if !request.uri().path().starts_with("/v1/") {
            return Either::Left(self.inner.call(request));
        }
        let header = request.headers().get(AUTHORIZATION);
        let reply = match header.map(|value| value.to_str()) {
            None => Some("no API key: send `Authorization: Bearer KEY` with a key given to --api-key"),
            Some(Ok(value)) if self.keys.accepts(value) => None,
            Some(_) => Some("the API key is not valid: send `Authorization: Bearer KEY` with a key given to --api-key"),
        };
        match reply {
            None => Either::Left(self.inner.call(request)),
            Some(message) => {
                let reply = ErrorReply::new(
                    StatusCode::UNAUTHORIZED,
                    message.to_owned(),
                    "invalid_api_key",
                );
                Either::Right(futures_util::future::ready(Ok(reply.into_response())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    async fn call(path: &str, authorization: Option<&str>) -> (StatusCode, String) {
        let handler = tower::service_fn(|_: Request| async {
            Ok::<_, std::convert::Infallible>(StatusCode::OK.into_response())
        });
        let service =
            ApiKeyLayer::new(["key-one".to_string(), "key-two".to_string()]).layer(handler);
        let mut request = Request::builder().uri(path);
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        let response = service
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn v1_routes_need_one_of_the_keys() {
        assert_eq!(
            call("/v1/models", Some("Bearer key-one")).await.0,
            StatusCode::OK
        );
        assert_eq!(
            call("/v1/models", Some("Bearer key-two")).await.0,
            StatusCode::OK
        );
        for authorization in [
            None,
            Some("Bearer key-three"),
            Some("key-one"),
            Some("Basic a2V5"),
        ] {
            let (status, body) = call("/v1/chat/completions", authorization).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{authorization:?}");
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
            assert_eq!(body["error"]["type"], "authentication_error", "{body}");
        }
    }

    #[tokio::test]
    async fn probes_and_metrics_stay_open() {
        for path in ["/health", "/ready", "/metrics"] {
            assert_eq!(call(path, None).await.0, StatusCode::OK, "{path}");
        }
    }
}
