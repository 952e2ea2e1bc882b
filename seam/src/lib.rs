//! The seam between Switchyard's router and its engine.
//!
//! The router knows the engine only through [`InferenceBackend`]: list the
//! models, say whether it is ready, report each checkpoint's live state for
//! routing, and submit one [`GenerationRequest`] that streams
//! [`GenerationEvent`]s back (or one [`EmbeddingRequest`] answered once). Every type that crosses between them lives here,
//! once: the router depends on this crate and on the policies, the engine on
//! this crate and on the kernels, and no arrow points back up.
//!
//! Everything OpenAI-specific (wire shapes, `n`, SSE framing, error bodies)
//! stays in the router; tokenizing, chat templates, context checks, stop
//! strings and sampling stay in the engine.

mod backend;
mod cache_scope;
mod checkpoint_ref;
mod checkpoint_state;
mod confidence;
mod constraint;
mod embedding;
mod error;
mod event;
mod margin;
mod model_card;
mod request;
mod tenant_share;

pub use backend::InferenceBackend;
pub use cache_scope::{CacheScope, ScopeOwner};
pub use checkpoint_ref::{CheckpointRef, ModelSpec};
pub use checkpoint_state::{CandidateState, CheckpointProbe};
pub use confidence::{ConfidenceParseError, TokenConfidence, CONFIDENCE_QUANTILES};
pub use constraint::{Constraint, Tool, ToolCall, TOOL_CALL_CLOSE, TOOL_CALL_OPEN};
pub use embedding::{Embedding, EmbeddingInput, EmbeddingReply, EmbeddingRequest};
pub use error::BackendError;
pub use event::{
    FinishReason, GeneratedToken, GenerationEvent, GenerationStream, TopLogprob, Usage,
    EVENT_BUFFER,
};
pub use margin::{MarginStatistic, TokenMargin, UnsureStop};
pub use model_card::ModelCard;
pub use request::{
    ChatMessage, GenerationRequest, Prompt, Role, SamplingOptions, SamplingRangeError,
    MAX_TOP_LOGPROBS,
};
pub use tenant_share::TenantShare;
