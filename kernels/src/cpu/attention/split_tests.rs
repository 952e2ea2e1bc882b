//! Splitting a deep context across tasks (`split`, `partial`) changes no
//! result: a decode step gives the same bits on one thread (one task per KV
//! head, segments merged as the walk goes) as on two or three (one task
//! per segment, merged by the last to finish; or, in a short context, one
//! task per part of the query heads), and as the same row computed
//! inside a prompt; and the split output stays within the streaming
//! tolerance of the straightforward reference.

use std::ops::Range;

use rand::{Rng, SeedableRng};

use super::partial::SEGMENT;
use super::reference::attend_one;
use super::split::{plan, seen_segments, Unit};
use super::*;
use crate::cpu::kv_cache::CpuKvCache;
use crate::cpu::Isa;
use crate::kv::KvFormat;

/// As `tests::STREAM_ABS_TOL` (outputs are convex combinations of values
/// in ±1; `exp`, summation order and fused multiply-adds differ from the
/// reference by a few 1e-7), with room for the deeper sums here: up to
/// 2,050 terms over three segments, each merge adding two roundings of
/// relative 2⁻²⁴ per element (1,400 terms were within 3e-6; the f32
/// reference's own sums grow with the terms too).
const SPLIT_ABS_TOL: f32 = 6e-6;

struct Layout {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    dtype: KvType,
}

fn random(rng: &mut impl Rng, n: usize, range: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-range..range)).collect()
}

/// Queries and keys in ±3, values in ±1, for `total` rows of `l`.
fn random_qkv(rng: &mut impl Rng, l: &Layout, total: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q_cols, kv_cols) = (l.n_heads * l.head_dim, l.n_kv_heads * l.head_dim);
    let q = random(rng, total * q_cols, 3.0);
    let k = random(rng, total * kv_cols, 3.0);
    let v = random(rng, total * kv_cols, 1.0);
    (q, k, v)
}

fn rows_of(data: &[f32], rows: Range<usize>, cols: usize) -> CpuActivations {
    CpuActivations {
        rows: rows.len(),
        cols,
        data: data[rows.start * cols..rows.end * cols].to_vec(),
    }
}

/// Runs `chunks` (row counts, in order) of the given rows through one
/// cache on `threads` threads; returns every row's output and the cache.
fn run(
    l: &Layout,
    threads: usize,
    isa: CheckedIsa,
    (q, k, v): (&[f32], &[f32], &[f32]),
    chunks: &[usize],
) -> (Vec<f32>, CpuKvCache) {
    let shape = AttentionShape {
        n_heads: l.n_heads,
        n_kv_heads: l.n_kv_heads,
        head_dim: l.head_dim,
        scale: 1.0 / (l.head_dim as f32).sqrt(),
        window: l.window,
        softcap: l.softcap,
    };
    let (q_cols, kv_cols) = (l.n_heads * l.head_dim, l.n_kv_heads * l.head_dim);
    let total: usize = chunks.iter().sum();
    let pool = ThreadPool::new(threads);
    // Blocks of 64 positions: a segment spans sixteen of them.
    let kv = KvFormat::new(l.dtype, 64);
    let mut cache = CpuKvCache::windowed(&kv, 1, l.n_kv_heads, l.head_dim, total, &[l.window])
        .expect("an unlimited pool holds the cache");
    let mut all = Vec::with_capacity(total * q_cols);
    let mut start = 0;
    for &n in chunks {
        let rows = start..start + n;
        let (q, k, v) = (
            rows_of(q, rows.clone(), q_cols),
            rows_of(k, rows.clone(), kv_cols),
            rows_of(v, rows, kv_cols),
        );
        let mut out = CpuActivations::zeros(n, q_cols);
        let call = AttentionCall {
            layer: 0,
            shape,
            q: &q,
            k: &k,
            v: &v,
            products: Products::F32,
        };
        let (store, seq) = cache.rows(0..n, start, true).expect("the cache's blocks");
        attention(&pool, isa, call, store, &[seq], &mut out).expect("attention over the cache");
        all.extend_from_slice(&out.data);
        start += n;
    }
    (all, cache)
}

#[test]
fn a_split_decode_step_matches_one_task_and_the_prompt_bit_for_bit() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
    let layouts = [
        // SmolLM2: three KV heads, a group of three.
        Layout {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            window: None,
            softcap: None,
            dtype: KvType::F16,
        },
        // Gemma 3's shape: one KV head; a window that spans segments.
        Layout {
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 32,
            window: Some(600),
            softcap: None,
            dtype: KvType::F32,
        },
        Layout {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 17,
            window: None,
            softcap: Some(5.0),
            dtype: KvType::F16,
        },
    ];
    // A prompt past one segment, decode steps (one crossing the segment
    // boundary at 2,048), then a short chunk.
    let depth = 2 * SEGMENT - 3;
    let decode = [depth, 1, 1, 1, 1, 3];
    let prompt = [depth + 7];
    let total = depth + 7;
    for l in &layouts {
        let (q, k, v) = random_qkv(&mut rng, l, total);
        let qkv = (&q[..], &k[..], &v[..]);
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            let (whole, _) = run(l, 2, isa, qkv, &prompt);
            let (one, _) = run(l, 1, isa, qkv, &decode);
            for threads in [2, 3] {
                let (split, mut cache) = run(l, threads, isa, qkv, &decode);
                assert!(
                    split == one,
                    "{isa:?} {} t{threads}: split decode differs from one task",
                    l.dtype
                );
                assert!(
                    split == whole,
                    "{isa:?} {} t{threads}: split decode differs from the prompt",
                    l.dtype
                );
                check_reference(l, &q, &split, &mut cache, depth..total);
            }
        }
        println!(
            "split decode bit-identical: {} heads / {} KV heads, window {:?}",
            l.n_heads, l.n_kv_heads, l.window
        );
    }
}

/// The outputs of `rows` against the reference, over the keys and values
/// the cache holds (so F16 is checked on what it rounded them to).
fn check_reference(l: &Layout, q: &[f32], out: &[f32], cache: &mut CpuKvCache, rows: Range<usize>) {
    if l.softcap.is_some() {
        // The reference has no cap; the bit-identity above covers it.
        return;
    }
    let (q_cols, group) = (l.n_heads * l.head_dim, l.n_heads / l.n_kv_heads);
    let scale = 1.0 / (l.head_dim as f32).sqrt();
    let mut want = vec![0.0f32; l.head_dim];
    // Each KV head's keys and values read back once, from the first
    // position any of the rows sees: a row attends over its window of them.
    let seen = |p: usize| l.window.map_or(0, |w| (p + 1).saturating_sub(w))..p + 1;
    let (first, hd) = (seen(rows.start).start, l.head_dim);
    let (keys, values): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (0..l.n_kv_heads)
        .map(|kv| {
            let keys = (first..rows.end)
                .flat_map(|s| cache.key(0, kv, s))
                .collect();
            let values = (first..rows.end)
                .flat_map(|s| cache.value(0, kv, s))
                .collect();
            (keys, values)
        })
        .unzip();
    for p in rows {
        let seen = seen(p);
        let span = (seen.start - first) * hd..(seen.end - first) * hd;
        for h in 0..l.n_heads {
            let kv = h / group;
            let at = p * q_cols + h * l.head_dim;
            attend_one(
                &q[at..at + l.head_dim],
                &keys[kv][span.clone()],
                &values[kv][span.clone()],
                scale,
                &mut want,
            );
            for (g, w) in out[at..at + l.head_dim].iter().zip(&want) {
                assert!(
                    (g - w).abs() <= SPLIT_ABS_TOL,
                    "{} position {p} head {h}: {g} vs {w}",
                    l.dtype
                );
            }
        }
    }
}

/// A decode step of a one-KV-head layer with Gemma 3's 512-position window
/// splits across two threads at every position past the window: with the
/// default segment (1,024) most positions' windows lay inside one segment,
/// one task, and the second thread waited.
#[test]
fn a_short_window_decode_step_splits_across_two_threads() {
    let window = Some(512);
    for p in 512..4200 {
        let (segment, segments) = seen_segments(window, p, p);
        let unit = Unit {
            seq: 0,
            kv_head: 0,
            rows: 0..1,
            first_pos: p,
            segment,
            segments,
        };
        let tasks = plan(vec![unit], 2, 4, 4 * (256 + 2)).tasks;
        assert!(tasks.len() >= 2, "position {p}: {} task(s)", tasks.len());
        // The longest task reads at most 256 of the window's 512 positions:
        // the two threads share it evenly.
        let longest = tasks
            .iter()
            .map(|t| {
                let start = (t.segments.start * segment).max(p + 1 - 512);
                (t.segments.end * segment).min(p + 1) - start
            })
            .max();
        assert!(longest <= Some(256), "position {p}: {longest:?}");
    }
}

/// A decode step of one KV head whose context is one segment (Gemma 3
/// below 256 positions) splits its query heads across the threads and
/// gives the bits of one task and of the prompt: on two and three threads,
/// for each KV type (F16 and F32 through the decode kernel, Q8_0 through
/// the per-row path), with and without a window and a softcap, from the
/// first position on.
#[test]
fn a_short_decode_step_of_one_kv_head_splits_its_query_heads_bit_for_bit() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    let layout = |head_dim, window, softcap, dtype| Layout {
        n_heads: 4,
        n_kv_heads: 1,
        head_dim,
        window,
        softcap,
        dtype,
    };
    let layouts = [
        layout(256, Some(512), None, KvType::F16),
        layout(256, None, None, KvType::F32),
        layout(64, Some(40), None, KvType::Q8_0),
        layout(32, None, Some(5.0), KvType::F16),
    ];
    // A one-token prompt, then decode steps to position 99.
    let total = 100;
    let decode = vec![1; total];
    let prompt = [total];
    for l in &layouts {
        let (q, k, v) = random_qkv(&mut rng, l, total);
        let qkv = (&q[..], &k[..], &v[..]);
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            let (whole, _) = run(l, 1, isa, qkv, &prompt);
            let (one, _) = run(l, 1, isa, qkv, &decode);
            assert!(
                one == whole,
                "{isa:?} {}: one-task decode differs from the prompt",
                l.dtype
            );
            for threads in [2, 3] {
                let (split, mut cache) = run(l, threads, isa, qkv, &decode);
                assert!(
                    split == one,
                    "{isa:?} {} t{threads}: head-split decode differs from one task",
                    l.dtype
                );
                if l.dtype != KvType::Q8_0 {
                    check_reference(l, &q, &split, &mut cache, 0..total);
                }
            }
        }
    }
}

/// The plan behind it: one task of one row and a group of four on two
/// threads becomes two tasks of two heads each, on three threads three
/// tasks of one or two heads; a tile of several rows, or as many tasks
/// as threads, is left whole.
#[test]
fn fewer_tasks_than_threads_split_a_decode_steps_query_heads() {
    let unit = |rows: Range<usize>, first_pos: usize| {
        let (segment, segments) = seen_segments(None, first_pos, first_pos + rows.len() - 1);
        Unit {
            seq: 0,
            kv_head: 0,
            rows,
            first_pos,
            segment,
            segments,
        }
    };
    let heads = |units: Vec<Unit>, threads: usize| -> Vec<Range<usize>> {
        plan(units, threads, 4, 4 * (64 + 2))
            .tasks
            .iter()
            .map(|t| t.heads.clone())
            .collect()
    };
    assert_eq!(heads(vec![unit(0..1, 10)], 1), vec![0..4]);
    assert_eq!(heads(vec![unit(0..1, 10)], 2), vec![0..2, 2..4]);
    // Largest part first.
    assert_eq!(heads(vec![unit(0..1, 10)], 3), vec![2..4, 0..1, 1..2]);
    assert_eq!(heads(vec![unit(0..1, 10)], 8), vec![0..1, 1..2, 2..3, 3..4]);
    assert_eq!(heads(vec![unit(0..3, 10)], 2), vec![0..4]);
    assert_eq!(
        heads(vec![unit(0..1, 10), unit(1..2, 11)], 2),
        vec![0..4, 0..4]
    );
}

/// Each split unit's count of tasks (which the last to finish counts down
/// to its merge) is the number of tasks that name it, also when those
/// tasks are cut again by query heads; an unsplit task names none.
#[test]
fn a_split_units_task_count_is_the_tasks_that_name_it() {
    let unit = |seq: usize, first_pos: usize| {
        let (segment, segments) = seen_segments(None, first_pos, first_pos);
        Unit {
            seq,
            kv_head: 0,
            rows: first_pos..first_pos + 1,
            first_pos,
            segment,
            segments,
        }
    };
    // (units' positions, threads, split units, tasks)
    let cases = [
        (vec![10], 2, 0, 2),
        (vec![SEGMENT], 2, 1, 2),
        (vec![4 * SEGMENT], 2, 1, 5),
        (vec![SEGMENT + 7], 4, 1, 4),
        (vec![3 * SEGMENT, 10], 2, 1, 5),
    ];
    for (positions, threads, n_splits, n_tasks) in cases {
        let units = positions
            .iter()
            .enumerate()
            .map(|(s, &p)| unit(s, p))
            .collect();
        let plan = plan(units, threads, 4, 4 * (64 + 2));
        assert_eq!(plan.splits.len(), n_splits, "{positions:?} on {threads}");
        assert_eq!(plan.tasks.len(), n_tasks, "{positions:?} on {threads}");
        for (u, split) in plan.splits.iter().enumerate() {
            let naming = plan.tasks.iter().filter(|t| t.split == Some(u)).count();
            assert_eq!(split.tasks, naming, "{positions:?} on {threads}, unit {u}");
        }
        assert!(plan
            .tasks
            .iter()
            .all(|t| t.split.is_some() == t.partial.is_some()));
    }
}
