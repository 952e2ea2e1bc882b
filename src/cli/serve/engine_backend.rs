//! The real engine behind the router's [`InferenceBackend`] seam.
//!
//! One [`Registry`] of model versions and one [`Executor`] thread for all of
//! them. A request's `model` (a name, an alias or `name@version`) resolves
//! to one resident version at submit; its tokenizer and chat template turn
//! the request into token ids, and the executor runs it on that version to
//! the end, whatever is activated meanwhile. Each generation's events are
//! converted to the router's shape by a [`RouterSink`] on the executor thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_engine::chat::ChatMessage as TemplateMessage;
use switchyard_engine::registry::{LiveSlot, Registry, RegistryErrorKind, RoutingState, Tier};
use switchyard_engine::sampling::{self, SamplingError, SamplingParams, StopCondition};
use switchyard_engine::serving::{
    CheckpointHandle, EventSink, Executor, ExecutorPulse, SequenceEvent, SequenceRequest,
    ServedCheckpoint, SubmitError,
};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::cpu::CpuBackend;
use switchyard_policies::CandidateState;
use switchyard_router::backend::{
    BackendError, CheckpointProbe, FinishReason, GeneratedToken, GenerationEvent,
    GenerationRequest, GenerationStream, InferenceBackend, ModelCard, Prompt, Role, TopLogprob,
    Usage,
};
use tokio::sync::mpsc;

/// What routing weighs for one checkpoint, from the registry's view of it and the
/// executor's pace.
fn candidate_state(state: RoutingState, pulse: &ExecutorPulse) -> CandidateState {
    let RoutingState {
        tier,
        bytes,
        queued,
    } = state;
    let step_ms = pulse.step_time().as_secs_f64() * 1e3;
    // Waiting requests start as running sequences finish: roughly one
    // batch slot per step; a cold version first reads its file (~1 GB/s).
    CandidateState {
        resident: tier == Tier::Ram,
        queue_depth: u32::try_from(queued).unwrap_or(u32::MAX),
        est_queue_wait_ms: queued as f64 * step_ms,
        est_swap_or_load_ms: if tier == Tier::Ram {
            0.0
        } else {
            bytes as f64 / 1e6
        },
        est_ms_per_token: step_ms,
        healthy: pulse.is_running(),
    }
}

/// One checkpoint's live state, kept by the router's engine view.
struct EngineProbe {
    live: Arc<LiveSlot<CpuBackend>>,
    pulse: ExecutorPulse,
}

impl CheckpointProbe for EngineProbe {
    fn state(&self) -> CandidateState {
        candidate_state(self.live.routing_state(), &self.pulse)
    }
}

/// Every served model version, behind the router's seam.
pub struct EngineBackend {
    registry: Arc<Registry<CpuBackend>>,
    executor: Executor<CpuBackend>,
    /// Unix seconds when the server started.
    created: u64,
    /// How long a request may take (the router's timeout), handed to the
    /// scheduler as each sequence's deadline.
    request_timeout: Duration,
}

impl EngineBackend {
    /// A backend over `registry`'s versions, run by `executor`.
    pub fn new(
        registry: Arc<Registry<CpuBackend>>,
        executor: Executor<CpuBackend>,
        created: u64,
        request_timeout: Duration,
    ) -> EngineBackend {
        EngineBackend {
            registry,
            executor,
            created,
            request_timeout,
        }
    }

    /// The registry (for the admin API).
    pub fn registry(&self) -> &Arc<Registry<CpuBackend>> {
        &self.registry
    }

    /// The executor (for the admin API's status).
    pub fn executor(&self) -> &Executor<CpuBackend> {
        &self.executor
    }

    fn checkpoint(&self, spec: &str) -> Result<CheckpointHandle<CpuBackend>, BackendError> {
        self.registry.resolve(spec).map_err(|e| match e.kind {
            RegistryErrorKind::NotFound => BackendError::UnknownModel {
                model: spec.to_owned(),
            },
            _ => BackendError::InvalidRequest {
                param: "model".into(),
                message: e.message,
            },
        })
    }
}

impl InferenceBackend for EngineBackend {
    fn models(&self) -> Vec<ModelCard> {
        let card = |id: String, checkpoint: &ServedCheckpoint<CpuBackend>| ModelCard {
            id,
            created: self.created,
            owned_by: "switchyard".into(),
            context_length: u32::try_from(checkpoint.model.config().context_length)
                .unwrap_or(u32::MAX),
        };
        let mut cards = Vec::new();
        for model in self.registry.status() {
            let Ok(active) = self.registry.resolve(&model.name) else {
                continue;
            };
            cards.push(card(model.name.clone(), &active));
            for version in model.versions.iter().filter(|v| v.tier == Tier::Ram) {
                let spec = format!("{}@{}", model.name, version.version);
                if let Ok(checkpoint) = self.registry.resolve(&spec) {
                    cards.push(card(spec, &checkpoint));
                }
            }
        }
        cards
    }

    fn pin_model(&self, model: &str) -> String {
        self.registry
            .resolve(model)
            .map_or_else(|_| model.to_owned(), |checkpoint| checkpoint.id.to_string())
    }

    fn checkpoint_state(&self, model: &str, version: Option<&str>) -> Option<CandidateState> {
        let state = self.registry.routing_state(model, version)?;
        Some(candidate_state(state, &self.executor.pulse()))
    }

    fn checkpoint_probe(&self, model: &str, version: &str) -> Option<Arc<dyn CheckpointProbe>> {
        let live = self.registry.live(model, version)?;
        Some(Arc::new(EngineProbe {
            live,
            pulse: self.executor.pulse(),
        }))
    }

    fn ready(&self) -> bool {
        self.executor.is_running() && !self.registry.active().is_empty()
    }

    fn healthy(&self) -> bool {
        self.executor.is_running()
    }

    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, BackendError> {
        let model = self.checkpoint(&request.model)?;
        let prompt = tokenize(&model, &request.prompt)?;
        let context = model.model.config().context_length;
        let prompt_tokens = to_u32(prompt.len());
        let context_u32 = to_u32(context);
        if prompt.is_empty() {
            return Err(invalid(
                prompt_param(&request.prompt),
                "the prompt is empty after tokenization; send some text",
            ));
        }
        if prompt.len() >= context {
            return Err(BackendError::ContextOverflow {
                prompt_tokens,
                max_tokens: 0,
                context: context_u32,
            });
        }
        if let Some(max_tokens) = request.max_tokens {
            if u64::from(prompt_tokens) + u64::from(max_tokens) > u64::from(context_u32) {
                return Err(BackendError::ContextOverflow {
                    prompt_tokens,
                    max_tokens,
                    context: context_u32,
                });
            }
        }
        let sampling = sampling_params(&request, model.tokenizer.vocab_size())?;
        let stop = StopCondition {
            stop_token_ids: model.tokenizer.eos_ids().to_vec(),
            stop_strings: request.stop.clone(),
            max_tokens: request.max_tokens.map(|m| m as usize),
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        let sink = RouterSink {
            sender,
            tokenizer: model.tokenizer.clone(),
            logprobs: request.logprobs.is_some(),
        };
        let sequence = SequenceRequest {
            prompt,
            sampling,
            stop,
            decoder: Some(model.tokenizer.decode_stream(true)),
            sink: Box::new(sink),
            deadline: Some(Instant::now() + self.request_timeout),
        };
        self.executor
            .submit(&model, sequence)
            .map_err(|e| match e {
                SubmitError::Overloaded { .. } => BackendError::Overloaded,
                SubmitError::EmptyPrompt => invalid(prompt_param(&request.prompt), &e.to_string()),
                SubmitError::PromptTooLong { .. } => BackendError::ContextOverflow {
                    prompt_tokens,
                    max_tokens: 0,
                    context: context_u32,
                },
                SubmitError::KvBudget { .. } => invalid("max_tokens", &e.to_string()),
                SubmitError::Stopped => BackendError::Internal {
                    message: e.to_string(),
                },
            })?;
        Ok(receiver)
    }
}

/// The prompt's token ids: chat template for conversations, BOS as the
/// model asks for raw text, ids checked against the vocabulary.
fn tokenize(
    model: &ServedCheckpoint<CpuBackend>,
    prompt: &Prompt,
) -> Result<Vec<u32>, BackendError> {
    let tokenizer = &model.tokenizer;
    match prompt {
        Prompt::Chat(messages) => {
            let messages: Vec<TemplateMessage> = messages
                .iter()
                .map(|m| TemplateMessage::new(template_role(m.role), m.content.clone()))
                .collect();
            let text = model
                .template
                .render(
                    &messages,
                    true,
                    tokenizer.bos_token(),
                    tokenizer.eos_token(),
                )
                .map_err(|e| invalid("messages", &e.to_string()))?;
            // The template writes any BOS itself (as `switchyard tokenize --chat`).
            tokenizer
                .encode(&text, false)
                .map_err(|e| invalid("messages", &e.to_string()))
        }
        Prompt::Text(text) => tokenizer
            .encode(text, true)
            .map_err(|e| invalid("prompt", &e.to_string())),
        Prompt::Tokens(ids) => {
            let vocab_size = tokenizer.vocab_size();
            match ids.iter().find(|&&id| id as usize >= vocab_size) {
                Some(id) => Err(invalid(
                    "prompt",
                    &format!("token id {id} is outside the vocabulary of {vocab_size} tokens"),
                )),
                None => Ok(ids.clone()),
            }
        }
    }
}

/// Templates know `system`; OpenAI's `developer` plays that part.
fn template_role(role: Role) -> &'static str {
    match role {
        Role::Developer => Role::System.as_str(),
        other => other.as_str(),
    }
}

fn prompt_param(prompt: &Prompt) -> &'static str {
    match prompt {
        Prompt::Chat(_) => "messages",
        Prompt::Text(_) | Prompt::Tokens(_) => "prompt",
    }
}

/// The engine's sampling parameters for `request`, checked against the vocabulary.
fn sampling_params(
    request: &GenerationRequest,
    vocab_size: usize,
) -> Result<SamplingParams, BackendError> {
    let options = &request.sampling;
    let params = SamplingParams {
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
        top_logprobs: request.logprobs.map_or(0, usize::from),
        ..SamplingParams::default()
    };
    params.validate_for_vocab(vocab_size).map_err(|e| {
        let param = match &e {
            SamplingError::InvalidParam { field, .. } if *field == "top_logprobs" => {
                if prompt_param(&request.prompt) == "messages" {
                    "top_logprobs"
                } else {
                    "logprobs"
                }
            }
            SamplingError::InvalidParam { field, .. } => field,
            SamplingError::BiasIdOutOfRange { .. } => "logit_bias",
            SamplingError::NoFiniteLogits => "logit_bias",
        };
        invalid(param, &e.to_string())
    })?;
    Ok(params)
}

fn invalid(param: &str, message: &str) -> BackendError {
    BackendError::InvalidRequest {
        param: param.to_owned(),
        message: message.to_owned(),
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Converts one sequence's events to the router's and forwards them.
struct RouterSink {
    sender: mpsc::UnboundedSender<GenerationEvent>,
    tokenizer: Tokenizer,
    logprobs: bool,
}

impl EventSink for RouterSink {
    fn send(&mut self, event: SequenceEvent) -> bool {
        let event = match event {
            SequenceEvent::Token(token) => GenerationEvent::Token(GeneratedToken {
                text: token.text,
                id: token.id,
                logprob: self.logprobs.then_some(token.logprob),
                top_logprobs: if self.logprobs {
                    token
                        .top_logprobs
                        .iter()
                        .map(|&(id, logprob)| TopLogprob {
                            text: self.tokenizer.decode(&[id], false).unwrap_or_default(),
                            id,
                            logprob,
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            }),
            SequenceEvent::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            } => GenerationEvent::Done {
                finish_reason: match finish_reason {
                    sampling::FinishReason::Stop => FinishReason::Stop,
                    sampling::FinishReason::Length => FinishReason::Length,
                },
                usage: Usage {
                    prompt_tokens: to_u32(prompt_tokens),
                    completion_tokens: to_u32(completion_tokens),
                },
            },
            SequenceEvent::Error(message) => {
                GenerationEvent::Error(BackendError::Internal { message })
            }
        };
        self.sender.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}
