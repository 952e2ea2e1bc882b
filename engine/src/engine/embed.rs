//! From an embedding request to a sequence the executor runs with the
//! others of its checkpoint ([`SequenceTask::Embed`]): the input's token ids,
//! the context and `dimensions` checks, and the sink that answers once.

use switchyard_kernels::Backend;
use switchyard_seam::{BackendError, Embedding, EmbeddingInput, EmbeddingRequest, Prompt};
use tokio::sync::oneshot;

use crate::prompt;
use crate::sampling::{SamplingParams, StopCondition};
use crate::serving::{EventSink, SequenceEvent, SequenceRequest, SequenceTask, ServedCheckpoint};

use super::prepare::check_context;

/// The request field every embedding error names (the router adds the index).
pub(super) const INPUT: &str = "input";

/// The sequence that embeds `request`'s input on `checkpoint`, answering on
/// `reply` by the request's deadline; or why it cannot run there.
pub(super) fn prepare_embedding<B: Backend>(
    checkpoint: &ServedCheckpoint<B>,
    request: &EmbeddingRequest,
    reply: oneshot::Sender<Result<Embedding, BackendError>>,
) -> Result<SequenceRequest, BackendError> {
    let config = checkpoint.model.config();
    if let Some(dimensions) = request.dimensions {
        if dimensions as usize != config.hidden_size {
            return Err(BackendError::invalid(
                "dimensions",
                format!(
                    "`{}` gives embeddings of {} dimensions and cannot shorten them; send \
                     dimensions = {} or leave it out",
                    checkpoint.id, config.hidden_size, config.hidden_size
                ),
            ));
        }
    }
    let input = match &request.input {
        EmbeddingInput::Text(text) => Prompt::Text(text.clone()),
        EmbeddingInput::Tokens(ids) => Prompt::Tokens(ids.clone()),
    };
    let ids = prompt::encode(&input, &checkpoint.tokenizer, &checkpoint.template)
        .map_err(|error| BackendError::invalid(INPUT, error.to_string()))?;
    // An embedding generates nothing: its input may fill the whole window.
    check_context(ids.len(), Some(0), config.context_length)?;
    Ok(SequenceRequest {
        prompt: ids,
        sampling: SamplingParams::default(),
        // Its KV cache holds the prompt and nothing more.
        stop: StopCondition {
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            max_tokens: Some(0),
            ..StopCondition::default()
        },
        decoder: None,
        sink: Box::new(EmbeddingSink(Some(reply))),
        deadline: request.deadline,
        constraint: None,
        cache_scope: switchyard_seam::CacheScope::deployment(),
        share: request.share.clone(),
        task: SequenceTask::Embed,
    })
}

/// Answers one embedding's [`switchyard_seam::EmbeddingReply`] with its
/// first and only result.
struct EmbeddingSink(Option<oneshot::Sender<Result<Embedding, BackendError>>>);

impl EventSink for EmbeddingSink {
    fn send(&mut self, event: SequenceEvent) -> bool {
        let Some(reply) = self.0.take() else {
            return false;
        };
        let result = match event {
            SequenceEvent::Embedding {
                vector,
                prompt_tokens,
            } => Ok(Embedding {
                vector,
                prompt_tokens: u32::try_from(prompt_tokens).unwrap_or(u32::MAX),
            }),
            SequenceEvent::Error(message) => Err(BackendError::Internal { message }),
            SequenceEvent::Token(_) | SequenceEvent::Done { .. } => Err(BackendError::Internal {
                message: "an embedding sequence generated a token".to_owned(),
            }),
        };
        reply.send(result).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.as_ref().is_none_or(oneshot::Sender::is_closed)
    }
}
