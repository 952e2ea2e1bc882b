//! Submitting a routed request's generations: the prompts prepared once (off the async
//! workers when large), the budget held for their real size, and the policy's fallback
//! when the chosen checkpoint refuses them.

use std::sync::Arc;

use crate::error::ApiError;
use crate::openai::tail::choice::{submit_all, Choice};
use crate::policy::RoutedRequest;
use crate::state::AppState;
use switchyard_seam::{BackendError, GenerationRequest, ModelSpec, Prompt, Usage};

/// Builds a request's generation requests for the model that is to run them (built
/// again only when a fallback checkpoint takes over the request).
pub type MakeRequests<'a> = &'a (dyn Fn(&ModelSpec) -> Vec<GenerationRequest> + Sync);

/// Prompts of at most this many bytes (tool definitions included) are prepared
/// (templated, tokenized) on the async worker that handles the request; larger ones on
/// the blocking pool, so that a few megabyte-sized prompts cannot stall every other
/// request (`/health` included). A request with a `response_format` or forced tool
/// calls always goes there: the engine waits for its grammar to compile.
const INLINE_PREPARE_BYTES: usize = 16 * 1024;

/// Submits the generations `make(model)` builds for the routed model; when the backend
/// refuses them and the policy names a fallback for that, submits again to the fallback.
/// Every refusal that ends the request is settled on `routed`.
pub async fn submit(
    state: &AppState,
    routed: &RoutedRequest,
    requested_model: &ModelSpec,
    make: MakeRequests<'_>,
    prompt_field: &'static str,
) -> Result<Vec<Choice>, ApiError> {
    if !routed.is_routed() {
        // Resolved here once: the submits (and any retry) name the checkpoint itself.
        if let Some(checkpoint) = state.backend().pin_model(requested_model) {
            routed.pin(checkpoint);
        }
    }
    loop {
        let model = routed.backend_model(requested_model);
        let mut requests = make(&model);
        // A cascade step judged by its first token stops there when it would be deferred.
        let stop_unsure = routed.unsure_stop();
        for request in &mut requests {
            request.stop_unsure = stop_unsure;
        }
        match prepare_and_submit(state, routed, requests, prompt_field).await {
            Ok(choices) => return Ok(choices),
            Err(ApiError::Backend { source, .. }) if routed.fall_back(&source) => continue,
            Err(error) => {
                match &error {
                    ApiError::Backend { source, .. } => routed.failed(source, Usage::default()),
                    // Refused before anything ran: no spend, no usage record.
                    ApiError::Refused(_) => routed.release(),
                    _ => routed.cancelled(Usage::default()),
                }
                return Err(error);
            }
        }
    }
}

/// [`cover_and_submit`], off the async workers when the prompts are large: templating
/// and tokenizing them is CPU work proportional to their size.
async fn prepare_and_submit(
    state: &AppState,
    routed: &RoutedRequest,
    requests: Vec<GenerationRequest>,
    prompt_field: &'static str,
) -> Result<Vec<Choice>, ApiError> {
    if !needs_blocking_pool(&requests) {
        return cover_and_submit(state, routed, requests, prompt_field);
    }
    // Waiting for a slot holds no thread; the slot is held until the work is done.
    let Ok(slot) = Arc::clone(state.heavy_prepares()).acquire_owned().await else {
        return Err(ApiError::backend(
            BackendError::Internal {
                message: "the preparation slots are closed".to_owned(),
            },
            prompt_field,
        ));
    };
    let state = state.clone();
    let routed = routed.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        cover_and_submit(&state, &routed, requests, prompt_field)
    })
    .await
    .unwrap_or_else(|failure| {
        Err(ApiError::backend(
            BackendError::Internal {
                message: format!("preparing the request failed: {failure}"),
            },
            prompt_field,
        ))
    })
}

/// Encodes the prompts on the routed checkpoint, holds the budget for their real size
/// ([`RoutedRequest::cover`]: refused before anything runs when it does not fit), then
/// submits the encoded prompts, so that the engine templates and tokenizes each once.
fn cover_and_submit(
    state: &AppState,
    routed: &RoutedRequest,
    mut requests: Vec<GenerationRequest>,
    prompt_field: &'static str,
) -> Result<Vec<Choice>, ApiError> {
    if routed.is_routed() {
        if let Some(counts) = encode_prompts(state, &mut requests, prompt_field)? {
            routed.cover(&counts)?;
        }
    }
    submit_all(state.backend(), requests, prompt_field)
}

/// Replaces each prompt with the backend's encoding of it (a handoff's answer prefix
/// included, so the prefix is taken off the request) and returns their token counts (one
/// per generation); `None` when the backend cannot encode before submitting. The `n`
/// generations of one prompt follow each other and are encoded once.
fn encode_prompts(
    state: &AppState,
    requests: &mut [GenerationRequest],
    prompt_field: &'static str,
) -> Result<Option<Vec<u32>>, ApiError> {
    let backend = state.backend();
    let mut counts = Vec::with_capacity(requests.len());
    let mut last: Option<(Prompt, Option<String>, Prompt)> = None;
    for request in requests.iter_mut() {
        if let Some((original, prefix, encoded)) = &last {
            if *original == request.prompt && *prefix == request.answer_prefix {
                request.prompt = encoded.clone();
                request.answer_prefix = None;
                counts.push(counts.last().copied().unwrap_or(0));
                continue;
            }
        }
        let ids = match backend.encode_prompt(request) {
            None => return Ok(None),
            Some(result) => result.map_err(|error| ApiError::backend(error, prompt_field))?,
        };
        counts.push(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        let chat = matches!(request.prompt, Prompt::Chat(_));
        let encoded = Prompt::Encoded { ids, chat };
        let original = std::mem::replace(&mut request.prompt, encoded.clone());
        last = Some((original, request.answer_prefix.take(), encoded));
    }
    Ok(Some(counts))
}

/// Whether preparing `requests` is work for the blocking pool: a grammar to compile, or
/// more than [`INLINE_PREPARE_BYTES`] to template and tokenize.
fn needs_blocking_pool(requests: &[GenerationRequest]) -> bool {
    requests.iter().any(|request| request.constraint.is_some())
        || prompt_bytes(requests) > INLINE_PREPARE_BYTES
}

/// Bytes of prompt text (token ids count four each) and of the tool definitions the
/// template writes into it, over every generation.
fn prompt_bytes(requests: &[GenerationRequest]) -> usize {
    requests
        .iter()
        .map(|request| {
            let prompt = match &request.prompt {
                Prompt::Text(text) => text.len(),
                Prompt::Tokens(ids) | Prompt::Encoded { ids, .. } => ids.len() * 4,
                Prompt::Chat(messages) => messages.iter().map(|m| m.content.len()).sum(),
            };
            let tools: usize = request
                .tools
                .iter()
                .map(|tool| {
                    tool.name.len()
                        + tool.description.as_ref().map_or(0, String::len)
                        + tool.parameters.len()
                })
                .sum();
            prompt + tools
        })
        .sum()
}
