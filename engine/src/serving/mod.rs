//! The shared engine's serving loop: many checkpoints, continuous batching
//! within each, a weight-table swap between them.
//!
//! An [`Executor`] owns a dedicated OS thread with the backend. Requests
//! arrive already tokenized ([`SequenceRequest`]) together with the
//! checkpoint version they run on ([`ServedCheckpoint`], shared). Each step
//! the thread admits waiting sequences into the one shared pool of KV-cache
//! slots, picks the checkpoint whose batch runs next (queue age, deadlines,
//! batch size, swap cost: `choice.rs`), points the weight table at it (and
//! at the checkpoints that share most of its tensors, which join the step:
//! `table.rs`), runs ONE forward pass over their batches (one decode row per
//! sequence plus prefill chunks), samples, streams tokens to each
//! [`EventSink`], and drops finished or cancelled sequences — and their KV
//! caches — at once. When nothing is active the thread sleeps.
//!
//! - `checkpoint.rs`: a loaded version (weights, tokenizer, template, counters);
//! - `queue.rs`: what a caller submits and receives, and the submit errors;
//! - `sequence.rs`: one sequence's state and what happens to a sampled token;
//! - `group.rs`: one checkpoint's queue and batch;
//! - `cache_use.rs`: each cache scope's use of the prompt cache, for the admin API;
//! - `fair.rs`: which tenant's waiting request takes the next batch slot;
//! - `step_room.rs`: how many prompt tokens a step runs beside its decode rows;
//! - `interleave.rs`: a newcomer's prompt between two layers of the step in flight;
//! - `tenant_cap.rs`: each tenant's part of the KV budget and of the queue;
//! - `choice.rs`: which checkpoint runs next;
//! - `step_family.rs`: checkpoints sharing steps (a base and its adapters)
//!   claim as one;
//! - `table.rs`: the weight table a step reads;
//! - `prefetch.rs`: checkpoints run once on the device, the next one copied
//!   up beside the current step;
//! - `step_profile.rs`: where a decode step's time goes (a measuring aid);
//! - `executor.rs`: the handle, the weight table and the scheduling loop.
//!
//! KV memory (the budget, admission by blocks, the prompt cache) is the
//! device-neutral `crate::kv`; the executor holds its [`crate::kv::KvPool`].

mod cache_use;
mod checkpoint;
mod choice;
mod executor;
mod fair;
mod group;
mod interleave;
mod prefetch;
mod queue;
mod sequence;
mod step_family;
mod step_profile;
mod step_room;
mod table;
mod tenant_cap;

use std::time::Duration;

pub use crate::kv::ScopeUsage;
pub use crate::kv::{kv_positions, KvAdvice};
pub use cache_use::ScopeCacheUse;
pub use checkpoint::{
    AdapterSource, CheckpointError, CheckpointHandle, CheckpointId, CheckpointOptions,
    ServedCheckpoint,
};
pub use choice::{choose, score, Claim};
pub use executor::{Executor, ExecutorConfig, ExecutorPulse, NoObserver};
pub use queue::{
    EventSink, SequenceEvent, SequenceRequest, SequenceTask, SequenceToken, SubmitError,
};

/// Hears what the executor thread does. Called on that thread: must not block.
pub trait ExecutorObserver: Send + Sync {
    /// `checkpoint` has `depth` requests waiting for a batch slot.
    fn queue_depth(&self, checkpoint: &CheckpointId, depth: usize) {
        let _ = (checkpoint, depth);
    }

    /// The weight table moved from `from` (none before the first step) to
    /// `to`; `latency` runs from the scheduler's decision to the moment the
    /// next forward starts reading the new table.
    fn swap(&self, from: Option<&CheckpointId>, to: &CheckpointId, latency: Duration) {
        let _ = (from, to, latency);
    }

    /// Verify steps of `checkpoint` checked `drafted` speculative draft
    /// tokens and kept `accepted` of them (`crate::speculate`).
    fn speculation(&self, checkpoint: &CheckpointId, drafted: usize, accepted: usize) {
        let _ = (checkpoint, drafted, accepted);
    }

    /// One forward step ran `rows` tokens of `sequences` sequences on `checkpoint`.
    fn step(&self, checkpoint: &CheckpointId, rows: usize, sequences: usize, elapsed: Duration) {
        let _ = (checkpoint, rows, sequences, elapsed);
    }

    /// A request to `checkpoint` was admitted with `cached` prompt tokens
    /// read from the prompt cache and `computed` left to run (the cache's
    /// hits and misses, in tokens). Only while the prompt cache is on and
    /// serves the checkpoint.
    fn prompt_cache(&self, checkpoint: &CheckpointId, cached: usize, computed: usize) {
        let _ = (checkpoint, cached, computed);
    }

    /// `blocks` cached prompt blocks were evicted to make room in the KV budget.
    fn prompt_cache_evicted(&self, blocks: usize) {
        let _ = blocks;
    }

    /// The prompt cache now holds `blocks` blocks taking `bytes` of the KV budget.
    fn prompt_cache_size(&self, blocks: usize, bytes: usize) {
        let _ = (blocks, bytes);
    }

    /// What the prompt cache holds per scope owner, every scope that holds
    /// a block (a scope left out holds none now).
    fn prompt_cache_scopes(&self, scopes: &[ScopeUsage]) {
        let _ = scopes;
    }
}
