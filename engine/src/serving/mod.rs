//! Continuous batching: many sequences share one forward step.
//!
//! An [`Executor`] owns a dedicated OS thread with the backend and the model.
//! Requests arrive already tokenized ([`SequenceRequest`]); each step the
//! thread admits waiting sequences (their prompts prefilled in chunks, with a
//! bound on tokens per step), runs ONE forward pass over every active
//! sequence (one decode row each, plus prefill chunks), samples each
//! sequence, streams its tokens to its [`EventSink`], and drops finished or
//! cancelled sequences — and their KV caches — at once. Sequences join and
//! leave between steps. When nothing is active the thread sleeps on its
//! request channel.
//!
//! - `queue.rs`: what a caller submits and receives, and the submit errors;
//! - `sequence.rs`: one sequence's state and what happens to a sampled token;
//! - `executor.rs`: the handle and the scheduling loop.

mod executor;
mod queue;
mod sequence;

pub use executor::{Executor, ExecutorConfig, QueueObserver};
pub use queue::{EventSink, SequenceEvent, SequenceRequest, SequenceToken, SubmitError};
