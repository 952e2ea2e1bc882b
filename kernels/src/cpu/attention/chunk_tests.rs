//! A prompt row's attention does not depend on the chunk it came in: the
//! same prompt fed whole, in chunks of 7, 128 and 300, and as a prefix
//! already in the cache with a tail of 12 or 1 rows after it gives the
//! same bits, under every precision (BF16 on AMX tiles included:
//! `stream::run_amx`, split in `bf16x3` too), in a layer with a window
//! and one without, at one and three threads. And a decode step's row
//! under `bf16-prompt` and `bf16x3` is the f32 walk's, bit for bit.

use rand::{Rng, SeedableRng};

use super::window_tests::{attend_chunk, shape, Sequence};
use super::*;
use crate::cpu::kv_cache::CpuKvCache;
use crate::cpu::Isa;
use crate::kv::KvFormat;

/// Gemma 3 270M's heads: four query heads on one KV head of 256.
const HEADS: (usize, usize, usize) = (4, 1, 256);

/// Past a segment (1,024), several spans (256), and a ring that turns
/// (a window of 512 with `RING_SLACK`).
const PROMPT: usize = 1100;

fn random(rng: &mut impl Rng, n: usize, range: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-range..range)).collect()
}

/// Chunk lengths from `lens` in turn (the last one repeated) until the
/// prompt is fed.
fn chunks(lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut fed = 0;
    while fed < PROMPT {
        let n = lens[out.len().min(lens.len() - 1)].min(PROMPT - fed);
        out.push(n);
        fed += n;
    }
    out
}

/// A fresh cache for `shape`, the prompt and one more row.
fn cache(shape: AttentionShape) -> CpuKvCache {
    let kv = KvFormat::new(KvType::F16, 64);
    let (_, n_kv_heads, head_dim) = HEADS;
    CpuKvCache::windowed(&kv, 1, n_kv_heads, head_dim, PROMPT + 1, &[shape.window])
        .expect("an unlimited pool holds the cache")
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_prompt_row_gives_the_same_bits_in_any_chunk() {
    let isa = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let b = bf16::Bf16Isa::new(isa);
    if !b.amx() {
        println!("no AMX here: every precision runs off AMX (still checked)");
    }
    let (n_heads, n_kv_heads, head_dim) = HEADS;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    // Scores up to a few units: later blocks raise the running maxima.
    let (q_cols, kv_cols) = (n_heads * head_dim, n_kv_heads * head_dim);
    let prompt = Sequence {
        q: random(&mut rng, (PROMPT + 1) * q_cols, 3.0),
        k: random(&mut rng, (PROMPT + 1) * kv_cols, 3.0),
        v: random(&mut rng, (PROMPT + 1) * kv_cols, 1.0),
        q_cols,
        kv_cols,
    };
    let feeds = [
        chunks(&[PROMPT]),
        chunks(&[7]),
        chunks(&[128]),
        chunks(&[300]),
        // A cached prefix (fed cold in chunks of 512) and a warm tail.
        chunks(&[512, 512, 64, 12]),
        chunks(&[PROMPT - 1, 1]),
    ];
    let precisions = [
        ("f32", Products::F32),
        ("bf16-prompt", Products::Bf16(b.for_prompts_only())),
        ("bf16", Products::Bf16(b)),
        (
            "bf16-prompt without AMX",
            Products::Bf16(b.without_amx().for_prompts_only()),
        ),
        ("bf16 without AMX", Products::Bf16(b.without_amx())),
        ("bf16x3", Products::Bf16(b.split_for_prompts())),
        (
            "bf16x3 without AMX",
            Products::Bf16(b.without_amx().split_for_prompts()),
        ),
    ];
    for window in [None, Some(512)] {
        let shape = shape(HEADS, window);
        for threads in [1, 3] {
            let pool = ThreadPool::new(threads);
            let mut whole_of = Vec::new();
            for (name, products) in precisions {
                let mut whole: Option<Vec<f32>> = None;
                for lens in &feeds {
                    let mut ring = cache(shape);
                    let mut all = Vec::new();
                    let mut start = 0;
                    for &n in lens {
                        let call = (shape, products);
                        let rows = (&prompt, true);
                        all.extend(attend_chunk(
                            (&pool, isa),
                            &mut ring,
                            call,
                            rows,
                            (start, n),
                        ));
                        start += n;
                    }
                    let first = lens.first().copied().unwrap_or(0);
                    match &whole {
                        None => whole = Some(all),
                        Some(want) => {
                            let same = bits(&all) == bits(want);
                            assert!(
                                same,
                                "{name} window {window:?} t{threads}: chunks from {first} \
                                 (of {} chunks) differ from the whole prompt",
                                lens.len()
                            );
                        }
                    }
                }
                whole_of.push(whole.expect("the whole prompt was fed"));
            }
            if b.amx() {
                // Else the test could pass with AMX never running.
                assert!(
                    bits(&whole_of[1]) != bits(&whole_of[0]),
                    "bf16-prompt took AMX's products (window {window:?} t{threads})"
                );
                assert!(
                    bits(&whole_of[5]) != bits(&whole_of[0])
                        && bits(&whole_of[5]) != bits(&whole_of[1]),
                    "bf16x3 took AMX's split products (window {window:?} t{threads})"
                );
            }
            // A decode step's row after the prompt: under bf16-prompt and
            // bf16x3 the f32 walk's bits.
            let step =
                [("f32", Products::F32), precisions[1], precisions[5]].map(|(_, products)| {
                    let mut ring = cache(shape);
                    attend_chunk(
                        (&pool, isa),
                        &mut ring,
                        (shape, products),
                        (&prompt, true),
                        (0, PROMPT),
                    );
                    attend_chunk(
                        (&pool, isa),
                        &mut ring,
                        (shape, products),
                        (&prompt, false),
                        (PROMPT, 1),
                    )
                });
            for (at, name) in [(1, "bf16-prompt"), (2, "bf16x3")] {
                assert!(
                    bits(&step[0]) == bits(&step[at]),
                    "window {window:?} t{threads}: a decode row under {name} is not f32's"
                );
            }
        }
    }
}
