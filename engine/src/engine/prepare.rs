//! From a generation request to a sequence the executor can run: the prompt's
//! token ids, the context check, the sampling parameters and the stop
//! condition. Every check that needs the checkpoint (its tokenizer, template,
//! vocabulary or context window) happens here, once.

use switchyard_kernels::Backend;
use switchyard_seam::{BackendError, GenerationEvent, GenerationRequest, SamplingOptions};
use tokio::sync::mpsc;

use crate::prompt::{self, PromptError};
use crate::sampling::{SamplingParams, StopCondition, MAX_TOP_LOGPROBS};
use crate::serving::{SequenceRequest, SequenceTask, ServedCheckpoint};
use crate::structured;

use super::events::StreamSink;

/// The sequence that runs `request` on `checkpoint`, reporting to `events` and due by
/// the request's deadline; or the reason the request cannot run there.
pub fn prepare<B: Backend>(
    checkpoint: &ServedCheckpoint<B>,
    request: &GenerationRequest,
    events: mpsc::Sender<GenerationEvent>,
) -> Result<SequenceRequest, BackendError> {
    let tokenizer = &checkpoint.tokenizer;
    let prompt = prompt::encode_with_tools(
        &request.prompt,
        &request.tools,
        request.answer_prefix.as_deref(),
        tokenizer,
        &checkpoint.template,
    )
    .map_err(|error| prompt_error(request, error))?;
    check_context(
        prompt.len(),
        request.max_tokens,
        checkpoint.model.config().context_length,
    )?;
    let sampling = sampling_params(request, tokenizer.vocab_size())?;
    let stop = StopCondition {
        stop_token_ids: tokenizer.eos_ids().to_vec(),
        stop_strings: request.stop.clone(),
        max_tokens: request.max_tokens.map(|m| m as usize),
        unsure: request.stop_unsure,
    };
    // Compiled here, before the request is queued: a schema the grammar
    // engine cannot enforce is refused up front, naming its field.
    let constraint = request
        .constraint
        .as_ref()
        .map(|constraint| {
            structured::compile(
                &checkpoint.grammar_vocab,
                tokenizer,
                constraint,
                &request.tools,
            )
        })
        .transpose()?;
    let sink = StreamSink::new(events, tokenizer.clone(), request.logprobs.is_some());
    Ok(SequenceRequest {
        prompt,
        sampling,
        stop,
        decoder: Some(tokenizer.decode_stream(true)),
        sink: Box::new(sink),
        deadline: request.deadline,
        constraint,
        cache_scope: request.cache_scope.clone(),
        share: request.share.clone(),
        task: SequenceTask::Generate,
    })
}

fn prompt_error(request: &GenerationRequest, error: PromptError) -> BackendError {
    BackendError::invalid(request.prompt_field(), error.to_string())
}

/// The one context check: the prompt must leave room for one token, and with
/// `max_tokens` for all of them (an embedding's `Some(0)`: for none).
pub(super) fn check_context(
    prompt_tokens: usize,
    max_tokens: Option<u32>,
    context: usize,
) -> Result<(), BackendError> {
    let needed = prompt_tokens as u64 + u64::from(max_tokens.unwrap_or(1));
    if needed <= context as u64 {
        return Ok(());
    }
    Err(BackendError::ContextOverflow {
        prompt_tokens: to_u32(prompt_tokens),
        max_tokens: max_tokens.unwrap_or(0),
        context: to_u32(context),
    })
}

/// The sampler's parameters for `request`: ranges by the seam's one rule, then what
/// only the vocabulary can tell (bias ids, alternatives asked for).
fn sampling_params(
    request: &GenerationRequest,
    vocab_size: usize,
) -> Result<SamplingParams, BackendError> {
    let options: &SamplingOptions = &request.sampling;
    options
        .check()
        .map_err(|error| BackendError::invalid(&error.field, error.to_string()))?;
    if let Some(&id) = options
        .logit_bias
        .keys()
        .find(|&&id| id as usize >= vocab_size)
    {
        return Err(BackendError::invalid(
            "logit_bias",
            format!("token id {id} is outside the vocabulary of {vocab_size} tokens"),
        ));
    }
    let top_logprobs = request.logprobs.map_or(0, usize::from);
    if top_logprobs > MAX_TOP_LOGPROBS {
        let field = match request.prompt_field() {
            "messages" => "top_logprobs",
            _ => "logprobs",
        };
        return Err(BackendError::invalid(
            field,
            format!("{top_logprobs} is above the maximum {MAX_TOP_LOGPROBS}"),
        ));
    }
    Ok(SamplingParams {
        temperature: options.temperature.unwrap_or(1.0),
        top_p: options.top_p.unwrap_or(1.0),
        seed: options.seed,
        presence_penalty: options.presence_penalty,
        frequency_penalty: options.frequency_penalty,
        logit_bias: options
            .logit_bias
            .iter()
            .map(|(&id, &bias)| (id, bias))
            .collect(),
        top_logprobs,
        ..SamplingParams::default()
    })
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::check_context;
    use switchyard_seam::BackendError;

    #[test]
    fn context_leaves_room_for_the_completion() {
        assert_eq!(check_context(10, Some(6), 16), Ok(()));
        assert_eq!(check_context(15, None, 16), Ok(()));
        assert_eq!(
            check_context(16, None, 16),
            Err(BackendError::ContextOverflow {
                prompt_tokens: 16,
                max_tokens: 0,
                context: 16
            })
        );
        assert_eq!(
            check_context(10, Some(7), 16),
            Err(BackendError::ContextOverflow {
                prompt_tokens: 10,
                max_tokens: 7,
                context: 16
            })
        );
    }
}
