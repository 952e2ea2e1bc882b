//! Causal grouped-query attention over a [`CpuKvCache`].
//!
//! Query head `h` reads KV head `h / (n_heads / n_kv_heads)`. The row at
//! position `p` attends to positions `0..=p` with a softmax that subtracts
//! the maximum score first, so `exp` never overflows. Work is split over
//! (row, head) pairs.

use std::cell::RefCell;
use std::ops::Range;

use super::disjoint::DisjointSlice;
use super::isa::CheckedIsa;
use super::kv_cache::CpuKvCache;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use super::vecmath::{axpy, dot};
use crate::{AttentionShape, KernelError};

thread_local! {
    /// Scores of one (row, head), reused across calls on each thread.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The inputs of one attention call, as the backend received them.
pub(crate) struct AttentionCall<'a> {
    pub(crate) layer: usize,
    pub(crate) shape: AttentionShape,
    pub(crate) q: &'a CpuActivations,
    pub(crate) k: &'a CpuActivations,
    pub(crate) v: &'a CpuActivations,
    pub(crate) rows: Range<usize>,
    pub(crate) start_pos: usize,
}

fn shape_error(detail: String) -> KernelError {
    KernelError::Shape {
        op: "attention",
        detail,
    }
}

fn validate(
    cache: &CpuKvCache,
    call: &AttentionCall<'_>,
    out: &CpuActivations,
) -> Result<(), KernelError> {
    let AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        ..
    } = call.shape;
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(shape_error(format!(
            "{n_heads} query heads are not a multiple of {n_kv_heads} KV heads"
        )));
    }
    if n_kv_heads != cache.n_kv_heads()
        || head_dim != cache.head_dim()
        || call.layer >= cache.layers()
    {
        return Err(shape_error(format!(
            "layer {} with {n_kv_heads} KV heads of {head_dim} does not fit a cache of {} layers, \
             {} KV heads of {}",
            call.layer,
            cache.layers(),
            cache.n_kv_heads(),
            cache.head_dim()
        )));
    }
    let q_cols = n_heads * head_dim;
    let kv_cols = n_kv_heads * head_dim;
    let rows_end = call.rows.end;
    let ok = call.rows.start <= rows_end
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
            call.rows,
            call.q.shape(),
            call.k.shape(),
            call.v.shape(),
            out.shape()
        )));
    }
    if call.start_pos > cache.len(call.layer) {
        return Err(shape_error(format!(
            "start position {} leaves a gap after the {} positions layer {} holds",
            call.start_pos,
            cache.len(call.layer),
            call.layer
        )));
    }
    let end = call.start_pos + call.rows.len();
    if end > cache.capacity() {
        return Err(KernelError::KvCacheFull {
            capacity: cache.capacity(),
            position: call.start_pos.max(cache.capacity()),
        });
    }
    Ok(())
}

pub(crate) fn attention(
    pool: &ThreadPool,
    isa: CheckedIsa,
    cache: &mut CpuKvCache,
    call: AttentionCall<'_>,
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    validate(cache, &call, out)?;
    let AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale,
    } = call.shape;
    let kv_cols = n_kv_heads * head_dim;
    for (i, row) in call.rows.clone().enumerate() {
        let key = &call.k.data[row * kv_cols..(row + 1) * kv_cols];
        let value = &call.v.data[row * kv_cols..(row + 1) * kv_cols];
        cache.write(call.layer, call.start_pos + i, key, value);
    }
    cache.set_len(call.layer, call.start_pos + call.rows.len());
    let cache: &CpuKvCache = cache;
    let group = n_heads / n_kv_heads;
    let q_cols = n_heads * head_dim;
    let first_row = call.rows.start;
    let out_data = DisjointSlice::new(&mut out.data);
    pool.run(call.rows.len() * n_heads, &|task| {
        let (i, head) = (task / n_heads, task % n_heads);
        let row = first_row + i;
        let seen = call.start_pos + i + 1;
        let kv_head = head / group;
        let query =
            &call.q.data[row * q_cols + head * head_dim..row * q_cols + (head + 1) * head_dim];
        // SAFETY: task (i, head) alone writes this head's slice of its row.
        let o = unsafe { out_data.range(row * q_cols + head * head_dim, head_dim) };
        SCORES.with(|scores| {
            let mut scores = scores.borrow_mut();
            attend_one(
                isa,
                query,
                cache.keys(call.layer, kv_head, seen),
                cache.values(call.layer, kv_head, seen),
                scale,
                &mut scores,
                o,
            );
        });
    });
    Ok(())
}

/// One query against `keys`/`values` (`seen × head_dim` each): `out` is the
/// softmax(`scale · q·k`)-weighted sum of the values.
fn attend_one(
    isa: CheckedIsa,
    query: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let head_dim = query.len();
    scores.clear();
    scores.extend(
        keys.chunks_exact(head_dim)
            .map(|k| scale * dot(isa, query, k)),
    );
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
    let mut total = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    out.fill(0.0);
    for (weight, value) in scores.iter().zip(values.chunks_exact(head_dim)) {
        axpy(isa, *weight, value, out);
    }
    let norm = 1.0 / total;
    out.iter_mut().for_each(|o| *o *= norm);
}
