//! The policy layer: routing each inference request through a
//! [`switchyard_policies::PolicyStore`].
//!
//! For `/v1/chat/completions`, `/v1/completions` and `/v1/embeddings` the [`PolicyLayer`]
//! middleware
//!
//! 1. parses and validates the body into the endpoint's request type (a 400 naming the
//!    field otherwise), which routing and the handler both read ([`Validated`]);
//! 2. authenticates the tenant from `Authorization: Bearer <key>` (hashed, compared in
//!    constant time by the policy crate);
//! 3. reads `model`, `max_tokens`, `user` and the prompt size from that validated
//!    request ([`routable`]; the prompt size is estimated from its characters), and the
//!    `x-switchyard-*` hint headers;
//! 4. routes with the current policy against live engine state
//!    ([`InferenceBackend::checkpoint_state`](switchyard_seam::InferenceBackend::checkpoint_state)),
//!    reserving the tenant's budget, or answers with an OpenAI-shaped error naming which
//!    constraint failed for which candidate (401, 403, 404, 429, 503 or 400);
//! 5. hands the handler a [`RoutedRequest`]; the backend is asked for `name@version`.
//!    Before the generation runs, the handler has the engine template and tokenize the
//!    prompts on that checkpoint and the reservation is resized to their real count
//!    ([`RoutedRequest::cover`]; 429 when it no longer fits), and the encoded prompts
//!    are what it submits;
//! 6. adds `x-switchyard-model`, `-version`, `-route` and `-cost` to the response
//!    (and `-cascade` when the policy's `[cascade]` judged the answer, see [`cascade`]).
//!
//! The handler settles the route when the request ends (`openai/tail/`):
//! budgets are charged the engine's token counts, the split's rollback rule gets the
//! outcome and latency, and a checkpoint that refuses (overloaded) or fails before any
//! output gives way to the policy's fallbacks.
//!
//! Metrics: the policy crate's (`switchyard_policy_*`, see
//! [`switchyard_policies::metrics`]) plus [`FALLBACKS_TOTAL`].

pub mod cascade;
pub mod engine_view;
pub mod error;
pub mod feedback;
pub mod layer;
pub(crate) mod rate_limit;
pub(crate) mod request;
pub mod routable;
pub mod routed;
pub mod routing;

pub use cascade::{
    CASCADE_HANDOFF_TOTAL, CASCADE_KEPT_TOKENS_TOTAL, CASCADE_STOPPED_EARLY_TOTAL, CASCADE_TOTAL,
};
pub use engine_view::BackendEngineView;
pub use error::PolicyRejection;
pub use layer::{PolicyLayer, PolicyService};
pub use routable::{ParseLimits, RoutableRequest, RoutingFields, Validated};
pub use routed::{RouteSummary, RoutedRequest};
pub use routing::PolicyRouting;

/// Counter: requests moved to a fallback after the backend refused or failed them, by
/// `from` and `to` checkpoint and `trigger` (`overloaded` or `failing`).
pub const FALLBACKS_TOTAL: &str = "switchyard_policy_fallbacks_total";
