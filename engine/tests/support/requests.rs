//! One sequence as the executor-level tests submit it (greedy, one scope, no
//! tenant) and its events read back until it ends. Include it with
//! `#[path = "support/requests.rs"] mod requests;`.
#![allow(dead_code)] // each test crate uses its own part

use std::sync::mpsc;
use std::time::Duration;

use switchyard_engine::sampling::{FinishReason, SamplingParams, StopCondition};
use switchyard_engine::serving::{EventSink, SequenceEvent, SequenceRequest, SequenceTask};

/// How long a test waits for a sequence's next event before failing: long
/// enough for a debug-free release build on a loaded 2-core machine.
pub const EVENT_WAIT: Duration = Duration::from_secs(300);

/// A greedy generation of `prompt` for at most `max_tokens` (`None`: until
/// a stop token or the context's end), its events sent to `sink`.
pub fn greedy(
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    sink: Box<dyn EventSink>,
) -> SequenceRequest {
    SequenceRequest {
        prompt,
        sampling: SamplingParams::default(),
        stop: StopCondition {
            max_tokens,
            ..StopCondition::default()
        },
        decoder: None,
        sink,
        deadline: None,
        constraint: None,
        cache_scope: switchyard_seam::CacheScope::default(),
        share: switchyard_seam::TenantShare::default(),
        task: SequenceTask::Generate,
    }
}

/// [`greedy`] with its events on a channel the test reads.
pub fn on_channel(
    prompt: Vec<u32>,
    max_tokens: usize,
) -> (SequenceRequest, mpsc::Receiver<SequenceEvent>) {
    let (sender, receiver) = mpsc::channel();
    (greedy(prompt, Some(max_tokens), Box::new(sender)), receiver)
}

/// Hands the executor one event at a time: it blocks on each until the test
/// has received the one before, so a test can hold a sequence in the batch.
pub struct OneSlot(pub mpsc::SyncSender<SequenceEvent>);

impl EventSink for OneSlot {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.0.send(event).is_ok()
    }
}

/// [`greedy`] with its events handed over one at a time ([`OneSlot`]).
pub fn on_one_slot(
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
) -> (SequenceRequest, mpsc::Receiver<SequenceEvent>) {
    let (sender, receiver) = mpsc::sync_channel(0);
    (
        greedy(prompt, max_tokens, Box::new(OneSlot(sender))),
        receiver,
    )
}

/// What one generation reported, in order.
pub struct Finished {
    pub ids: Vec<u32>,
    /// The tokens' text, where the request had a decoder.
    pub text: String,
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// Every token until `Done`; panics on an error, an embedding, or a silence
/// longer than [`EVENT_WAIT`].
pub fn finish(receiver: &mpsc::Receiver<SequenceEvent>) -> Finished {
    let (mut ids, mut text, mut logprobs) = (Vec::new(), String::new(), Vec::new());
    loop {
        match receiver.recv_timeout(EVENT_WAIT) {
            Ok(SequenceEvent::Token(token)) => {
                ids.push(token.id);
                text.push_str(&token.text);
                logprobs.push(token.logprob);
            }
            Ok(SequenceEvent::Done {
                finish_reason,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            }) => {
                return Finished {
                    ids,
                    text,
                    logprobs,
                    finish_reason,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                }
            }
            Ok(SequenceEvent::Error(message)) => panic!("sequence failed: {message}"),
            Ok(SequenceEvent::Embedding { .. }) => panic!("a generation reported an embedding"),
            Err(e) => panic!("no event from the sequence: {e}"),
        }
    }
}

/// The ids [`finish`] collects.
pub fn ids(receiver: &mpsc::Receiver<SequenceEvent>) -> Vec<u32> {
    finish(receiver).ids
}
