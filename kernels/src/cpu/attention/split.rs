//! Which tiles of a call are split across their context's segments, and
//! the merge of a split tile's segment states (by whichever of its tasks
//! finishes last).
//!
//! Splitting never changes a result (see `partial`): the choice is about
//! keeping the threads busy. A call whose tiles already give every thread
//! several tasks (a prompt, a large batch) runs a task per tile; one with
//! fewer (a decode step of one or a few sequences, whose tasks would be
//! one per KV head) runs a task per segment of each tile, so a deep
//! context spreads over every thread whatever the number of KV heads.
//! A call that still has fewer tasks than threads (a decode step of one
//! KV head before its context spans two segments: Gemma 3 below 256
//! positions) also splits each one-row task's query heads: every head's
//! arithmetic is its own, so that changes no result either.

use std::cmp::Reverse;
use std::ops::Range;

use super::partial::{merge, normalize, segment_len, state_len};
use crate::cpu::isa::CheckedIsa;

/// Below this many tile tasks per thread the tiles are split: with three
/// KV heads on two threads one task per head leaves a thread idle for a
/// third of the step.
const TASKS_PER_THREAD: usize = 4;

/// The most floats of segment states one call keeps (16 MB): a call that
/// would need more has enough tiles to keep the threads busy unsplit.
const MAX_PARTIAL_FLOATS: usize = 1 << 22;

/// A tile of one sequence's query rows for one KV head.
#[derive(Clone)]
pub(super) struct Unit {
    pub(super) seq: usize,
    pub(super) kv_head: usize,
    pub(super) rows: Range<usize>,
    pub(super) first_pos: usize,
    /// Positions per segment in this layer (`partial::segment_len`).
    pub(super) segment: usize,
    /// Every segment some row of the tile sees.
    pub(super) segments: Range<usize>,
}

/// The segment length of a layer whose rows see `window` positions, and
/// the segments that rows at positions `first_pos..=last` see.
pub(super) fn seen_segments(
    window: Option<usize>,
    first_pos: usize,
    last: usize,
) -> (usize, Range<usize>) {
    let segment = segment_len(window);
    let first_seen = window.map_or(0, |w| (first_pos + 1).saturating_sub(w));
    (segment, first_seen / segment..last / segment + 1)
}

/// One task: some segments of a unit for some of its query heads (of the
/// group); when the unit is split, the buffer offset of its segment's
/// states and the unit's index in [`Plan::splits`].
pub(super) struct Task {
    pub(super) unit: Unit,
    pub(super) segments: Range<usize>,
    pub(super) heads: Range<usize>,
    pub(super) partial: Option<usize>,
    pub(super) split: Option<usize>,
}

/// A split unit: its segments' states lie at `at`, `slot` floats each,
/// written by `tasks` tasks; the last of them to finish merges them.
pub(super) struct Split {
    pub(super) unit: Unit,
    pub(super) at: usize,
    slot: usize,
    pub(super) tasks: usize,
}

impl Split {
    pub(super) fn len(&self) -> usize {
        self.slot * self.unit.segments.len()
    }
}

pub(super) struct Plan {
    pub(super) tasks: Vec<Task>,
    pub(super) splits: Vec<Split>,
    /// Floats of segment states the split units need.
    pub(super) partial_len: usize,
}

/// Tasks for `units` on `threads` threads, each unit's query rows having
/// `group` heads; `per_row` is the floats one query row's states take for
/// a segment (group × `state_len`).
pub(super) fn plan(units: Vec<Unit>, threads: usize, group: usize, per_row: usize) -> Plan {
    let slot = |u: &Unit| u.rows.len() * per_row;
    let deep = |u: &Unit| u.segments.len() > 1;
    let needed: usize = units
        .iter()
        .filter(|u| deep(u))
        .map(|u| slot(u) * u.segments.len())
        .sum();
    let split = threads > 1
        && units.len() < TASKS_PER_THREAD * threads
        && needed > 0
        && needed <= MAX_PARTIAL_FLOATS;
    let mut tasks = Vec::new();
    let mut splits = Vec::new();
    let mut at = 0;
    for unit in units {
        if split && deep(&unit) {
            let slot = slot(&unit);
            for (k, segment) in unit.segments.clone().enumerate() {
                tasks.push(Task {
                    unit: unit.clone(),
                    segments: segment..segment + 1,
                    heads: 0..group,
                    partial: Some(at + k * slot),
                    split: Some(splits.len()),
                });
            }
            let split = Split {
                unit,
                at,
                slot,
                tasks: 0,
            };
            at += split.len();
            splits.push(split);
        } else {
            tasks.push(Task {
                segments: unit.segments.clone(),
                unit,
                heads: 0..group,
                partial: None,
                split: None,
            });
        }
    }
    if !tasks.is_empty() && tasks.len() < threads {
        tasks = split_heads(tasks, threads, group);
    }
    for task in &tasks {
        if let Some(split) = task.split.and_then(|u| splits.get_mut(u)) {
            split.tasks += 1;
        }
    }
    // Most positions to read first: the pool hands tasks out in index
    // order, so a long one does not end up alone on one thread at the end.
    tasks.sort_by_key(|t| {
        let segment = t.unit.segment;
        let end = (t.segments.end * segment).min(t.unit.first_pos + t.unit.rows.len());
        let positions = end.saturating_sub(t.segments.start * segment);
        Reverse(t.unit.rows.len() * t.heads.len() * positions)
    });
    Plan {
        tasks,
        splits,
        partial_len: at,
    }
}

/// `tasks` (fewer than `threads`) with each one-row task's query heads
/// cut into as many parts as there are threads per task, at most one head
/// each. Both parts read the whole KV head, but it is short here: fewer
/// tasks than threads means at most one or two segments per KV head.
fn split_heads(tasks: Vec<Task>, threads: usize, group: usize) -> Vec<Task> {
    let parts = (threads / tasks.len()).clamp(1, group.max(1));
    let mut out = Vec::with_capacity(tasks.len() * parts);
    for task in tasks {
        if task.unit.rows.len() != 1 || parts == 1 {
            out.push(task);
            continue;
        }
        for part in 0..parts {
            let heads = group * part / parts..group * (part + 1) / parts;
            out.push(Task {
                unit: task.unit.clone(),
                segments: task.segments.clone(),
                heads,
                partial: task.partial,
                split: task.split,
            });
        }
    }
    out
}

/// Merges a split unit's segment states (`partials`, in segment order) and
/// hands each query's output to `out(row, head, values)`.
pub(super) fn merge_unit(
    isa: CheckedIsa,
    split: &Split,
    group: usize,
    head_dim: usize,
    partials: &[f32],
    mut out: impl FnMut(usize, usize, &[f32]),
) {
    let len = state_len(head_dim);
    let mut acc = vec![0.0f32; head_dim];
    for i in 0..split.unit.rows.len() {
        for h in 0..group {
            let qi = i * group + h;
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            acc.fill(0.0);
            for state in partials.chunks_exact(split.slot) {
                let state = &state[qi * len..(qi + 1) * len];
                merge(
                    isa,
                    (&mut max, &mut sum, &mut acc),
                    (state[0], state[1], &state[2..]),
                );
            }
            normalize(isa, sum, &mut acc);
            out(i, h, &acc);
        }
    }
}
