//! A deterministic in-process backend for tests (feature `fake`).
//!
//! It "generates" a fixed reply word by word, honours `max_tokens`, stop
//! strings, an unsure stop (every token's margin is 1 nat), context length and
//! logprobs, and records what it saw: every submitted request, and every
//! generation cancelled because its stream was dropped. It can be held (generations wait until released), made slow,
//! made to fail mid-stream, made overloaded, or made not ready.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use switchyard_policies::CandidateState;
use tokio::sync::{mpsc, watch, Notify};

use switchyard_seam::{
    BackendError, CheckpointProbe, CheckpointRef, FinishReason, GeneratedToken, GenerationEvent,
    GenerationRequest, GenerationStream, InferenceBackend, ModelCard, ModelSpec, Prompt,
    TokenConfidence, TokenMargin, TopLogprob, UnsureStop, Usage,
};

/// The model a default fake serves.
pub const FAKE_MODEL: &str = "fake-model";
/// Its context length.
pub const FAKE_CONTEXT: u32 = 64;
/// The reply a default fake generates, one word per token.
pub const FAKE_REPLY: &str = "The quick brown fox jumps over the lazy dog";

/// Every token's margin: its alternatives are 1 nat apart (`top_logprobs`).
pub const FAKE_MARGIN: TokenMargin = TokenMargin {
    margin: 1.0,
    entropy: 0.5,
};
/// The margin of the token [`FakeBackendBuilder::unsure_at`] makes unsure.
pub const FAKE_UNSURE_MARGIN: TokenMargin = TokenMargin {
    margin: 0.25,
    entropy: 1.5,
};

/// The fake engine. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct FakeBackend {
    shared: Arc<Shared>,
}

struct Shared {
    models: Vec<ModelCard>,
    reply: Vec<String>,
    token_delay: Duration,
    fail_after: Option<usize>,
    unsure_at: Option<usize>,
    ready: AtomicBool,
    healthy: AtomicBool,
    overloaded: AtomicBool,
    // `true` lets generations run; `false` makes them wait (for load tests).
    gate: watch::Sender<bool>,
    submitted: Mutex<Vec<GenerationRequest>>,
    cancelled: AtomicUsize,
    cancelled_changed: Notify,
    encodes: bool,
}

impl Default for FakeBackend {
    fn default() -> Self {
        FakeBackend::builder().build()
    }
}

/// Configures a [`FakeBackend`].
pub struct FakeBackendBuilder {
    models: Vec<ModelCard>,
    reply: String,
    token_delay: Duration,
    fail_after: Option<usize>,
    unsure_at: Option<usize>,
    ready: bool,
    held: bool,
    encodes: bool,
}

impl FakeBackendBuilder {
    /// Serve these models instead of [`FAKE_MODEL`].
    pub fn models(mut self, models: Vec<ModelCard>) -> Self {
        self.models = models;
        self
    }

    /// Generate `reply` (split on spaces, one token per word).
    pub fn reply(mut self, reply: &str) -> Self {
        self.reply = reply.to_owned();
        self
    }

    /// Wait this long before each token.
    pub fn token_delay(mut self, delay: Duration) -> Self {
        self.token_delay = delay;
        self
    }

    /// Send an `Internal` error after `tokens` tokens.
    pub fn fail_after(mut self, tokens: usize) -> Self {
        self.fail_after = Some(tokens);
        self
    }

    /// Make the token at `index` (0-based) unsure: its top-2 margin is
    /// [`FAKE_UNSURE_MARGIN`] instead of every other token's [`FAKE_MARGIN`].
    pub fn unsure_at(mut self, index: usize) -> Self {
        self.unsure_at = Some(index);
        self
    }

    /// Start not ready.
    pub fn not_ready(mut self) -> Self {
        self.ready = false;
        self
    }

    /// Answer [`InferenceBackend::encode_prompt`] (one id per word, one more per chat
    /// message), as the engine does; without it the fake cannot encode before submitting.
    pub fn encodes_prompts(mut self) -> Self {
        self.encodes = true;
        self
    }

    /// Start held: generations wait until [`FakeBackend::release`].
    pub fn held(mut self) -> Self {
        self.held = true;
        self
    }

    /// The backend.
    pub fn build(self) -> FakeBackend {
        let mut reply = Vec::new();
        for (i, word) in self.reply.split(' ').enumerate() {
            reply.push(if i == 0 {
                word.to_owned()
            } else {
                format!(" {word}")
            });
        }
        let (gate, _) = watch::channel(!self.held);
        FakeBackend {
            shared: Arc::new(Shared {
                models: self.models,
                reply,
                token_delay: self.token_delay,
                fail_after: self.fail_after,
                unsure_at: self.unsure_at,
                ready: AtomicBool::new(self.ready),
                healthy: AtomicBool::new(true),
                overloaded: AtomicBool::new(false),
                gate,
                submitted: Mutex::new(Vec::new()),
                cancelled: AtomicUsize::new(0),
                cancelled_changed: Notify::new(),
                encodes: self.encodes,
            }),
        }
    }
}

impl FakeBackend {
    /// A builder with the defaults: [`FAKE_MODEL`], [`FAKE_REPLY`], no delay, ready.
    pub fn builder() -> FakeBackendBuilder {
        FakeBackendBuilder {
            models: vec![ModelCard {
                parent: None,
                id: FAKE_MODEL.to_owned(),
                created: 1_700_000_000,
                owned_by: "switchyard".to_owned(),
                context_length: FAKE_CONTEXT,
            }],
            reply: FAKE_REPLY.to_owned(),
            token_delay: Duration::ZERO,
            fail_after: None,
            unsure_at: None,
            ready: true,
            held: false,
            encodes: false,
        }
    }

    /// Sets what `ready()` answers.
    pub fn set_ready(&self, ready: bool) {
        self.shared.ready.store(ready, Ordering::SeqCst);
    }

    /// Sets what `healthy()` answers (false: as if the engine's executor had died).
    pub fn set_healthy(&self, healthy: bool) {
        self.shared.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Makes `submit` refuse with `Overloaded` (or stop refusing).
    pub fn set_overloaded(&self, overloaded: bool) {
        self.shared.overloaded.store(overloaded, Ordering::SeqCst);
    }

    /// Lets held generations run.
    pub fn release(&self) {
        self.shared.gate.send_replace(true);
    }

    /// Every request submitted so far, in order.
    pub fn submitted(&self) -> Vec<GenerationRequest> {
        self.shared
            .submitted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Generations cancelled because their stream was dropped.
    pub fn cancelled(&self) -> usize {
        self.shared.cancelled.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` generations were cancelled; false on timeout.
    pub async fn wait_for_cancelled(&self, count: usize, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let changed = self.shared.cancelled_changed.notified();
                if self.cancelled() >= count {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    fn prompt_tokens(prompt: &Prompt) -> u32 {
        let count = match prompt {
            // One token per word plus one per message for the template's markers.
            Prompt::Chat(messages) => messages
                .iter()
                .map(|m| m.content.split_whitespace().count() + 1)
                .sum(),
            Prompt::Text(text) => text.split_whitespace().count(),
            Prompt::Tokens(ids) | Prompt::Encoded { ids, .. } => ids.len(),
        };
        u32::try_from(count).unwrap_or(u32::MAX)
    }
}

/// The fake's routing probe: every served checkpoint is resident, idle and healthy, as
/// a backend with no state to report; it exists so that routing over the fake takes the
/// same per-slot probe path as over the engine.
struct FakeProbe;

impl CheckpointProbe for FakeProbe {
    fn state(&self) -> CandidateState {
        CandidateState::default()
    }
}

impl InferenceBackend for FakeBackend {
    fn models(&self) -> Vec<ModelCard> {
        self.shared.models.clone()
    }

    fn encode_prompt(&self, request: &GenerationRequest) -> Option<Result<Vec<u32>, BackendError>> {
        self.shared
            .encodes
            .then(|| Ok(vec![1; Self::prompt_tokens(&request.prompt) as usize]))
    }

    fn checkpoint_probe(&self, model: &str, version: &str) -> Option<Arc<dyn CheckpointProbe>> {
        let served = self.shared.models.iter().any(|card| {
            card.id == model
                || ModelSpec::parse(&card.id) == CheckpointRef::new(model, version).into()
        });
        served.then(|| Arc::new(FakeProbe) as Arc<dyn CheckpointProbe>)
    }

    fn ready(&self) -> bool {
        self.shared.ready.load(Ordering::SeqCst)
    }

    fn healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::SeqCst)
    }

    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, BackendError> {
        let card = self
            .shared
            .models
            .iter()
            .find(|card| ModelSpec::parse(&card.id) == request.model)
            .ok_or_else(|| BackendError::UnknownModel {
                model: request.model.to_string(),
            })?;
        if self.shared.overloaded.load(Ordering::SeqCst) {
            return Err(BackendError::Overloaded);
        }
        let prompt_tokens = Self::prompt_tokens(&request.prompt);
        let room = card.context_length.saturating_sub(prompt_tokens);
        let max_tokens = request.max_tokens.unwrap_or(room);
        if prompt_tokens >= card.context_length || max_tokens > room {
            return Err(BackendError::ContextOverflow {
                prompt_tokens,
                max_tokens: request.max_tokens.unwrap_or(0),
                context: card.context_length,
            });
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|err| BackendError::Internal {
                message: format!("the fake backend needs a Tokio runtime: {err}"),
            })?;
        self.shared
            .submitted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request.clone());
        let (sender, receiver) = mpsc::channel(switchyard_seam::EVENT_BUFFER);
        let shared = Arc::clone(&self.shared);
        let job = Job {
            shared: Arc::clone(&shared),
            sender: sender.clone(),
            stop: request.stop,
            stop_unsure: request.stop_unsure,
            logprobs: request.logprobs,
            max_tokens,
            prompt_tokens,
        };
        runtime.spawn(async move {
            tokio::select! {
                () = job.run() => {}
                () = sender.closed() => {
                    shared.cancelled.fetch_add(1, Ordering::SeqCst);
                    shared.cancelled_changed.notify_waiters();
                }
            }
        });
        Ok(receiver)
    }
}

struct Job {
    shared: Arc<Shared>,
    sender: mpsc::Sender<GenerationEvent>,
    stop: Vec<String>,
    stop_unsure: Option<UnsureStop>,
    logprobs: Option<u8>,
    max_tokens: u32,
    prompt_tokens: u32,
}

impl Job {
    async fn run(self) {
        let mut gate = self.shared.gate.subscribe();
        if gate.wait_for(|open| *open).await.is_err() {
            return;
        }
        let mut produced = 0u32;
        let mut logprobs = Vec::new();
        let mut finish_reason = FinishReason::Stop;
        for (i, word) in self.shared.reply.iter().enumerate() {
            if produced == self.max_tokens {
                finish_reason = FinishReason::Length;
                break;
            }
            if self.stop.iter().any(|stop| word.contains(stop.as_str())) {
                break;
            }
            if self.shared.fail_after == Some(i) {
                let error = BackendError::Internal {
                    message: format!("fake failure after {i} tokens"),
                };
                // A failed generation ends here; the error is its last event.
                let _ = self.sender.send(GenerationEvent::Error(error)).await;
                return;
            }
            if !self.shared.token_delay.is_zero() {
                tokio::time::sleep(self.shared.token_delay).await;
            }
            let token = self.token(i, word);
            logprobs.push(Self::logprob(i));
            if self
                .sender
                .send(GenerationEvent::Token(token))
                .await
                .is_err()
            {
                // The receiver is gone: let `closed()` count the cancellation.
                return std::future::pending().await;
            }
            produced += 1;
            if self
                .stop_unsure
                .is_some_and(|stop| stop.stops_at(i, &self.margin(i)))
            {
                finish_reason = FinishReason::Unsure;
                break;
            }
        }
        let margins: Vec<TokenMargin> = (0..logprobs.len()).map(|i| self.margin(i)).collect();
        let done = GenerationEvent::Done {
            finish_reason,
            usage: Usage {
                prompt_tokens: self.prompt_tokens,
                cached_tokens: 0,
                completion_tokens: produced,
            },
            confidence: TokenConfidence::of(&mut logprobs, &margins),
        };
        let _ = self.sender.send(done).await;
    }

    /// The `i`th token's margin: [`FAKE_MARGIN`], or [`FAKE_UNSURE_MARGIN`] at the
    /// token made unsure.
    fn margin(&self, i: usize) -> TokenMargin {
        if self.shared.unsure_at == Some(i) {
            FAKE_UNSURE_MARGIN
        } else {
            FAKE_MARGIN
        }
    }

    /// The fake's log-probability of its `i`th token: less sure as it goes.
    fn logprob(i: usize) -> f32 {
        -0.1 * (i as f32 + 1.0)
    }

    fn token(&self, i: usize, word: &str) -> GeneratedToken {
        let id = 1000 + u32::try_from(i).unwrap_or(u32::MAX - 1000);
        let logprob = Self::logprob(i);
        GeneratedToken {
            text: word.to_owned(),
            id,
            logprob: self.logprobs.map(|_| logprob),
            top_logprobs: (0..self.logprobs.unwrap_or(0))
                .map(|k| TopLogprob {
                    text: if k == 0 {
                        word.to_owned()
                    } else {
                        format!("alt{k}")
                    },
                    id: if k == 0 { id } else { u32::from(k) },
                    logprob: logprob - f32::from(k),
                })
                .collect(),
            margin: Some(self.margin(i)),
        }
    }
}
