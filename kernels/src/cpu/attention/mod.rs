//! Causal grouped-query attention over sequences' block tables, in a
//! [`CpuKvStore`].
//!
//! Query head `h` reads KV head `h / (n_heads / n_kv_heads)`. The row at
//! position `p` attends to positions `0..=p` with a softmax computed online
//! (see `stream`), so `exp` never overflows. One call takes every sequence
//! of a step: one pool job runs a task per (sequence, KV head, tile of
//! query rows), the tiles with the most positions to read first. When
//! those tasks are too few to keep the threads busy (a decode step of one
//! or a few sequences: SmolLM2 has three KV heads, Gemma 3 one), each
//! tile is split into its segments of the context (`partial`), one task
//! each, and the last of a tile's tasks to finish merges its segments in
//! order; a decode step with still fewer tasks than threads splits its
//! query heads (`split`). A sequence whose rows fit one unsplit tile
//! (decode) has its new keys and values stored by its tasks, each its own
//! KV head; any other stores them before the job.

pub(crate) mod bf16;
mod bf16x3;
#[cfg(test)]
mod bf16x3_tests;
mod blocked;
#[cfg(target_arch = "x86_64")]
mod blocked_amx;
mod blocked_span;
#[cfg(test)]
mod chunk_tests;
mod decode;
#[cfg(test)]
mod decode_tests;
mod online;
mod partial;
#[cfg(test)]
mod q8_tests;
#[cfg(test)]
mod reference;
mod scores;
mod span_pack;
mod span_share;
mod split;
#[cfg(test)]
mod split_tests;
mod stream;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod window_tests;

use super::disjoint::DisjointSlice;
use super::isa::CheckedIsa;
use super::kv_q8::Q8Byte;
use super::kv_store::{CpuKvStore, LayerHeads, Stored, KEY_BLOCK};
use super::prefetch::prefetch_all;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::kv::{KvLayout, KvType};
use crate::{AttentionRows, AttentionShape, KernelError};
use partial::{segment_len, state_len};
use smallvec::SmallVec;
use span_share::Want;
use split::{plan, seen_segments, Plan, Unit};
use std::sync::atomic::{AtomicUsize, Ordering};
use stream::{attend_tile, Tile, ROW_TILE};

pub(crate) use bf16::Products;

/// The inputs every sequence of one attention call shares.
#[derive(Clone, Copy)]
pub(crate) struct AttentionCall<'a> {
    pub(crate) layer: usize,
    pub(crate) shape: AttentionShape,
    pub(crate) q: &'a CpuActivations,
    pub(crate) k: &'a CpuActivations,
    pub(crate) v: &'a CpuActivations,
    pub(crate) products: Products,
}

/// One sequence of a call, as the backend's callers give it.
pub(crate) type SeqRows<'a> = AttentionRows<'a>;

fn shape_error(detail: String) -> KernelError {
    KernelError::Shape {
        op: "attention",
        detail,
    }
}

/// Rows of one prompt chunk that layer `layer` can take in one go: a
/// windowed layer's ring holds the window plus this many rows less one,
/// so writing them before reading overwrites nothing still needed.
fn piece_rows(layout: &KvLayout, layer: usize) -> usize {
    let block = layout.block_positions();
    match (layout.window(layer), layout.max_blocks(layer)) {
        (Some(w), blocks) if blocks * block < layout.capacity() => {
            (blocks * block + 1).saturating_sub(w).max(1)
        }
        _ => usize::MAX,
    }
}

fn validate(
    call: &AttentionCall<'_>,
    seq: &SeqRows<'_>,
    out: &CpuActivations,
) -> Result<(), KernelError> {
    let AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        ..
    } = call.shape;
    let layout = seq.table.layout();
    if let Some(ring) = layout.window(call.layer) {
        if call.shape.window != Some(ring) {
            return Err(shape_error(format!(
                "layer {} of the cache keeps a window of {ring} positions but the call asks \
                 for {:?}; create the cache with the model's windows",
                call.layer, call.shape.window
            )));
        }
    }
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(shape_error(format!(
            "{n_heads} query heads are not a multiple of {n_kv_heads} KV heads"
        )));
    }
    if n_kv_heads != layout.n_kv_heads()
        || head_dim != layout.head_dim()
        || call.layer >= layout.layers()
    {
        return Err(shape_error(format!(
            "layer {} with {n_kv_heads} KV heads of {head_dim} does not fit a cache of {} layers, \
             {} KV heads of {}",
            call.layer,
            layout.layers(),
            layout.n_kv_heads(),
            layout.head_dim()
        )));
    }
    let q_cols = n_heads * head_dim;
    let kv_cols = n_kv_heads * head_dim;
    let rows_end = seq.rows.end;
    let ok = seq.rows.start <= rows_end
        && call.q.cols == q_cols
        && out.cols == q_cols
        && call.k.cols == kv_cols
        && call.v.cols == kv_cols
        && rows_end <= call.q.rows
        && rows_end <= call.k.rows
        && rows_end <= call.v.rows
        && rows_end <= out.rows;
    if !ok {
        return Err(shape_error(format!(
            "rows {:?} of q {}, k {}, v {}, out {} for {n_heads} heads / {n_kv_heads} KV heads of {head_dim}",
            seq.rows,
            call.q.shape(),
            call.k.shape(),
            call.v.shape(),
            out.shape()
        )));
    }
    let end = seq.start_pos + seq.rows.len();
    if end > layout.capacity() {
        return Err(KernelError::KvCacheFull {
            capacity: layout.capacity(),
            position: seq.start_pos.max(layout.capacity()),
        });
    }
    let held = seq.table.layer(call.layer).len();
    if held < seq.table.blocks_for(call.layer, end) {
        return Err(shape_error(format!(
            "layer {}'s table holds {held} blocks, too few for positions up to {end}; \
             allocate them before attention",
            call.layer
        )));
    }
    Ok(())
}

pub(crate) fn attention(
    pool: &ThreadPool,
    isa: CheckedIsa,
    call: AttentionCall<'_>,
    store: &mut CpuKvStore,
    seqs: &[SeqRows<'_>],
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    // Every table of a call has one type; a mixed call is an error
    // (`layer_heads` reports it).
    match seqs.first().map(|s| s.table.layout().dtype()) {
        Some(KvType::F16) => attention_typed::<half::f16>(pool, isa, call, store, seqs, out),
        Some(KvType::F32) => attention_typed::<f32>(pool, isa, call, store, seqs, out),
        Some(KvType::Q8_0) => attention_typed::<Q8Byte>(pool, isa, call, store, seqs, out),
        None => Ok(()),
    }
}

fn attention_typed<E: Stored>(
    pool: &ThreadPool,
    isa: CheckedIsa,
    call: AttentionCall<'_>,
    store: &mut CpuKvStore,
    seqs: &[SeqRows<'_>],
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    let too_long =
        |s: &SeqRows<'_>| s.rows.len() > piece_rows(s.table.layout(), call.layer).max(ROW_TILE);
    if !seqs.iter().any(too_long) {
        return attention_job::<E>(pool, isa, call, store, seqs, out);
    }
    // A prompt chunk longer than a windowed layer's ring allows runs in
    // pieces, one after another, so that no row's write overwrites a key
    // an earlier row still reads; the other sequences run together.
    let mut rest = Vec::with_capacity(seqs.len());
    for seq in seqs {
        if !too_long(seq) {
            rest.push(SeqRows {
                table: seq.table,
                rows: seq.rows.clone(),
                start_pos: seq.start_pos,
                prompt: seq.prompt,
            });
            continue;
        }
        let piece = piece_rows(seq.table.layout(), call.layer);
        let mut first = seq.rows.start;
        while first < seq.rows.end {
            let end = first.saturating_add(piece).min(seq.rows.end);
            let one = [SeqRows {
                table: seq.table,
                rows: first..end,
                start_pos: seq.start_pos + (first - seq.rows.start),
                prompt: seq.prompt,
            }];
            attention_job::<E>(pool, isa, call, store, &one, out)?;
            first = end;
        }
    }
    attention_job::<E>(pool, isa, call, store, &rest, out)
}

/// [`attention`] for sequences whose rows each fit their layer's ring.
fn attention_job<E: Stored>(
    pool: &ThreadPool,
    isa: CheckedIsa,
    call: AttentionCall<'_>,
    store: &mut CpuKvStore,
    seqs: &[SeqRows<'_>],
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    let mut rows_end = 0;
    for seq in seqs {
        validate(&call, seq, out)?;
        // Tasks write their rows of `out` through one shared slice: the
        // sequences' rows must not overlap.
        if seq.rows.start < rows_end && !seq.rows.is_empty() {
            return Err(shape_error(format!(
                "rows {:?} overlap an earlier sequence's rows (which end at {rows_end}); \
                 give sequences disjoint rows in ascending order",
                seq.rows
            )));
        }
        rows_end = rows_end.max(seq.rows.end);
    }
    let AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale,
        window,
        softcap,
    } = call.shape;
    let kv_cols = n_kv_heads * head_dim;
    let group = n_heads / n_kv_heads;
    let q_cols = n_heads * head_dim;
    let first_seen = |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));
    let segment = segment_len(window);
    let mut units = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        // A prompt's tiles on AMX take more rows (`blocked::for_rows`),
        // but a short chunk's (a warm tail) keep `ROW_TILE` so that its few
        // rows still spread over the threads: a row's bits do not depend
        // on its tile.
        let (_, tile) = blocked::for_rows(call.products, seq.prompt, head_dim);
        let tile = tile
            .filter(|&t| seq.rows.len() >= pool.threads() * t)
            .unwrap_or(ROW_TILE);
        for first in seq.rows.clone().step_by(tile) {
            let rows = first..(first + tile).min(seq.rows.end);
            let first_pos = seq.start_pos + (first - seq.rows.start);
            let last = first_pos + rows.len() - 1;
            let (_, segments) = seen_segments(window, first_pos, last);
            for kv_head in 0..n_kv_heads {
                units.push(Unit {
                    seq: s,
                    kv_head,
                    rows: rows.clone(),
                    first_pos,
                    segment,
                    segments: segments.clone(),
                });
            }
        }
    }
    let tiles: Vec<usize> = (0..seqs.len())
        .map(|s| {
            units
                .iter()
                .filter(|u| u.seq == s && u.kv_head == 0)
                .count()
        })
        .collect();
    let Plan {
        tasks,
        splits,
        partial_len,
    } = plan(units, pool.threads(), group, group * state_len(head_dim));
    // A sequence of one unsplit tile (a decode step) leaves its writes to
    // its tasks, which run in parallel; any other (a prompt, or a step split
    // across its context or its query heads) writes here first, since other
    // tasks read the new rows' keys of the same KV head.
    let writes: Vec<bool> = seqs
        .iter()
        .enumerate()
        .map(|(s, seq)| {
            seq.rows.len() <= ROW_TILE
                && !splits.iter().any(|u| u.unit.seq == s)
                && !tasks
                    .iter()
                    .any(|t| t.unit.seq == s && t.heads.len() < group)
        })
        .collect();
    let tables: Vec<_> = seqs
        .iter()
        .map(|s| (s.table, s.start_pos..s.start_pos + s.rows.len()))
        .collect();
    let heads: Vec<LayerHeads<'_, E>> = store.layer_heads::<E>(call.layer, &tables)?;
    for ((seq, &writes), cache) in seqs.iter().zip(&writes).zip(&heads) {
        if !writes {
            for (i, row) in seq.rows.clone().enumerate() {
                let key = &call.k.data[row * kv_cols..(row + 1) * kv_cols];
                let value = &call.v.data[row * kv_cols..(row + 1) * kv_cols];
                for head in 0..n_kv_heads {
                    let span = head * head_dim..(head + 1) * head_dim;
                    // SAFETY: no job runs yet; the block is this sequence's
                    // alone (`layer_heads` checked).
                    unsafe {
                        cache.write(head, seq.start_pos + i, &key[span.clone()], &value[span])
                    };
                }
            }
        }
    }
    let wants = share_wants(&call, seqs, &tiles, &writes, &heads);
    // The caches are written above, and only by decode tasks below, whose
    // sequences share nothing (`share_wants`).
    span_share::with_shared(pool, isa, head_dim, &wants, |shared| {
        let mut partials = vec![0.0f32; partial_len];
        let partial_data = DisjointSlice::new(&mut partials);
        let out_data = DisjointSlice::new(&mut out.data);
        let out_at = |unit: &Unit, i: usize, h: usize| {
            (unit.rows.start + i) * q_cols + (unit.kv_head * group + h) * head_dim
        };
        let attend = |t: usize| {
            let task = &tasks[t];
            let unit = &task.unit;
            let cache = &heads[unit.seq];
            let seen_last = unit.first_pos + unit.rows.len();
            // Blocks to read: every position's so far, or the whole ring
            // (allocated up to the last position: `ensure` above).
            let blocks = seen_last
                .div_ceil(KEY_BLOCK)
                .min(cache.ring())
                .min(cache.allocated());
            let ring = cache.ring().max(1);
            // Ask for this task's first block now (see `prefetch`); the walk
            // asks for each next one while it computes the one before.
            let first_block =
                (unit.segments.start * segment).max(first_seen(unit.first_pos)) / KEY_BLOCK;
            if first_block % ring < blocks {
                // SAFETY: no other task writes this KV head during the job (see
                // the writes below), and this view ends here.
                unsafe { prefetch_all(cache.key_block(unit.kv_head, first_block % ring)) };
            }
            let span = unit.kv_head * head_dim..(unit.kv_head + 1) * head_dim;
            if writes[unit.seq] {
                for (i, row) in unit.rows.clone().enumerate() {
                    let at = row * kv_cols;
                    let key = &call.k.data[at..at + kv_cols][span.clone()];
                    let value = &call.v.data[at..at + kv_cols][span.clone()];
                    // SAFETY: a writing task is its sequence's only task for
                    // `kv_head` (its rows fit one tile split neither across
                    // its context nor its query heads), so nothing
                    // else touches that head of the layer during the job.
                    unsafe { cache.write(unit.kv_head, unit.first_pos + i, key, value) };
                }
            }
            // The key blocks this task reads: its segments' (a deep context's
            // task reads a few of hundreds), or a windowed layer's whole ring
            // (where positions wrap around it).
            let reads = match window {
                Some(_) => 0..blocks,
                None => {
                    let end = (task.segments.end * segment).min(seen_last);
                    first_block.min(blocks)..end.div_ceil(KEY_BLOCK).min(blocks)
                }
            };
            // SAFETY: the head is written only by this task (just above, now
            // finished) or before the job; other tasks only read it.
            let runs: Vec<&[E]> = reads
                .clone()
                .map(|b| unsafe { cache.key_block(unit.kv_head, b) })
                .collect();
            let (products, _) = blocked::for_rows(call.products, seqs[unit.seq].prompt, head_dim);
            // The task's query heads, from `heads.start` of the group.
            let heads = task.heads.clone();
            let tile = Tile {
                products,
                rows: unit.rows.len(),
                first_pos: unit.first_pos,
                group: heads.len(),
                head_dim,
                scale,
                window,
                softcap,
                ring: cache.ring(),
                key_blocks: cache.key_blocks(),
                runs: &runs,
                first_run: reads.start,
                segment,
                segments: task.segments.clone(),
                shared: shared.get(unit.seq, unit.kv_head),
            };
            let query = |i: usize, h: usize| {
                let at = out_at(unit, i, heads.start + h);
                &call.q.data[at..at + head_dim]
            };
            match task.partial {
                None => attend_tile(isa, &tile, query, |merged| {
                    let (i, h, values) = merged.output(isa);
                    // SAFETY: this task alone writes its heads of KV head
                    // `kv_head` in its rows, and sequences' rows are disjoint
                    // (checked above).
                    let o = unsafe { out_data.range(out_at(unit, i, heads.start + h), head_dim) };
                    o.copy_from_slice(values);
                }),
                Some(at) => attend_tile(isa, &tile, query, |merged| {
                    let len = state_len(head_dim);
                    let qi = merged.row * group + heads.start + merged.head;
                    // SAFETY: each split task owns its queries' slots of the
                    // buffer.
                    let slot = unsafe { partial_data.range(at + qi * len, len) };
                    slot[0] = merged.max;
                    slot[1] = merged.sum;
                    slot[2..].copy_from_slice(merged.acc);
                }),
            }
        };
        let finish = |u: usize| {
            let split = &splits[u];
            let unit = &split.unit;
            // SAFETY: every task of the unit has finished (`remaining`); its
            // part of the buffer is only read now.
            let partials = unsafe { partial_data.range(split.at, split.len()) };
            split::merge_unit(isa, split, group, head_dim, partials, |i, h, values| {
                // SAFETY: this unit alone writes the heads of its KV head in
                // its rows (its segments' tasks wrote only the buffer).
                let o = unsafe { out_data.range(out_at(unit, i, h), head_dim) };
                o.copy_from_slice(values);
            });
        };
        // The last of a split unit's tasks to finish merges its states,
        // rather than a second phase after every task: a thread done early
        // then leaves the job instead of waiting in it (where, past the
        // pool's spin, it yields its core to whatever else is runnable and
        // may be late back for the merge). The decrement releases the
        // task's states and the last one's acquires them all.
        let remaining: SmallVec<[AtomicUsize; 4]> =
            splits.iter().map(|s| AtomicUsize::new(s.tasks)).collect();
        pool.run(tasks.len(), &|t| {
            attend(t);
            if let Some(u) = tasks[t].split {
                if remaining[u].fetch_sub(1, Ordering::AcqRel) == 1 {
                    finish(u);
                }
            }
        });
    });
    Ok(())
}

/// The (sequence, KV head)s whose tiles share their packed blocks
/// (`span_share`): a prompt's on AMX in two tiles or more (`tiles`),
/// its keys and values written before the job.
fn share_wants<'c, 'a, E: Stored>(
    call: &AttentionCall<'_>,
    seqs: &[SeqRows<'_>],
    tiles: &[usize],
    writes: &[bool],
    heads: &'c [LayerHeads<'a, E>],
) -> Vec<Want<'c, 'a, E>> {
    let AttentionShape {
        n_kv_heads,
        head_dim,
        window,
        ..
    } = call.shape;
    let mut wants = Vec::new();
    for (s, (seq, cache)) in seqs.iter().zip(heads).enumerate() {
        let b = match blocked::for_rows(call.products, seq.prompt, head_dim).0 {
            Products::Bf16(b) if blocked_span::takes(b, head_dim) => b,
            _ => continue,
        };
        if tiles[s] < 2 || writes[s] {
            continue;
        }
        let first_seen = window.map_or(0, |w| (seq.start_pos + 1).saturating_sub(w));
        let end = seq.start_pos + seq.rows.len();
        for kv_head in 0..n_kv_heads {
            wants.push(Want {
                seq: s,
                kv_head,
                cache,
                b,
                blocks: first_seen / KEY_BLOCK..end.div_ceil(KEY_BLOCK),
                end,
            });
        }
    }
    wants
}
