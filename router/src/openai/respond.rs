//! Answering a validated, routed request, whole or streamed: the one flow chat and
//! completions share. Each endpoint says only how its stream chunks and its whole
//! body look ([`Answer`]).

use axum::response::Response;
use http::HeaderMap;
use switchyard_seam::{ModelSpec, Prompt, Usage};

use crate::error::ApiError;
use crate::layers::request_id::request_id;
use crate::layers::request_metrics::labelled_response;
use crate::layers::timeout::Deadline;
use crate::openai::params::{GenerationParams, ResponseMode};
use crate::openai::tail::finished::Finished;
use crate::openai::tail::stream::{judged_stream, stream_response, ChunkFormat, StreamSettings};
use crate::openai::tail::whole::finish_whole;
use crate::policy::RoutedRequest;
use crate::state::AppState;

/// What an endpoint's answer looks like.
pub trait Answer {
    /// The request field holding the prompt, named when it does not fit the context.
    const PROMPT_FIELD: &'static str;
    /// The response id's prefix (`chatcmpl`, `cmpl`).
    const ID_PREFIX: &'static str;
    /// The stream's chunk format.
    type Chunks: ChunkFormat;

    /// The chunk format of a streamed answer.
    fn chunks(self, head: Head, include_usage: bool) -> Self::Chunks;

    /// The whole answer, from every finished choice and the request's usage.
    fn whole(self, head: Head, finished: Vec<Finished>, usage: Usage)
        -> Result<Response, ApiError>;
}

/// What every chunk and whole body of one answer carries.
#[derive(Debug, Clone)]
pub struct Head {
    /// `{prefix}-{request id}`.
    pub id: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// The checkpoint that answers, `name@version`.
    pub model: String,
}

/// The generations a validated request asks for.
#[derive(Debug, Clone)]
pub struct Generations {
    /// The model name as sent.
    pub model: String,
    /// One or more prompts; each gets `params.n` choices.
    pub prompts: Vec<Prompt>,
    /// Generation parameters.
    pub params: GenerationParams,
    /// Whole JSON or SSE.
    pub mode: ResponseMode,
}

/// Runs `generations` on the routed checkpoint (with the policy's fallbacks) and
/// answers as `answer` shapes it; the response is labelled with the model for metrics.
pub async fn respond<A: Answer>(
    state: &AppState,
    routed: &RoutedRequest,
    headers: &HeaderMap,
    deadline: Deadline,
    generations: Generations,
    answer: A,
) -> Response {
    let requested = ModelSpec::parse(&generations.model);
    let outcome = run(
        state,
        routed,
        &request_id(headers),
        deadline,
        &requested,
        &generations,
        answer,
    )
    .await;
    labelled_response(&routed.backend_model(&requested).to_string(), outcome)
}

async fn run<A: Answer>(
    state: &AppState,
    routed: &RoutedRequest,
    request_id: &str,
    deadline: Deadline,
    requested: &ModelSpec,
    generations: &Generations,
    answer: A,
) -> Result<Response, ApiError> {
    let Generations {
        model: _,
        prompts,
        params,
        mode,
    } = generations;
    // Built again only when a fallback checkpoint takes over the request.
    let scope = routed.cache_scope();
    let share = routed.tenant_share();
    let make = |model: &ModelSpec| {
        let mut requests = params.requests(request_id, model, &scope, prompts.clone());
        for request in &mut requests {
            request.share = share.clone();
            request.deadline = deadline.0;
        }
        requests
    };
    let id = format!("{}-{request_id}", A::ID_PREFIX);
    let created = unix_now();
    match *mode {
        ResponseMode::Stream { include_usage } => {
            let (events, total) =
                judged_stream(state, routed, requested, &make, A::PROMPT_FIELD, params.n).await?;
            let head = Head {
                id,
                created,
                model: routed.backend_model(requested).to_string(),
            };
            let settings = StreamSettings {
                n: params.n,
                include_usage,
                prompt_field: A::PROMPT_FIELD,
                keep_alive: state.config().sse_keep_alive,
            };
            Ok(stream_response(
                events,
                total,
                routed.clone(),
                answer.chunks(head, include_usage),
                settings,
            ))
        }
        ResponseMode::Whole => {
            let (finished, usage) =
                finish_whole(state, routed, requested, &make, A::PROMPT_FIELD, params.n).await?;
            let head = Head {
                id,
                created,
                model: routed.backend_model(requested).to_string(),
            };
            answer.whole(head, finished, usage)
        }
    }
}

/// Seconds since the Unix epoch, for OpenAI's `created` fields.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or_default()
}
