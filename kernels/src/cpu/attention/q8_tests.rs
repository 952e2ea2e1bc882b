//! Attention over a Q8_0 cache against attention over an F32 cache given
//! the same keys and values already rounded through Q8_0 (`round_q8`):
//! bit-identical, since widening reproduces the f32 layout exactly and the
//! kernels then do the same arithmetic. Windowed layers (Gemma 3's rings)
//! and capped scores included, on every ISA the host has.

use rand::{Rng, SeedableRng};

use super::*;
use crate::cpu::kv_cache::CpuKvCache;
use crate::cpu::kv_q8::round_q8;
use crate::cpu::Isa;
use crate::kv::KvFormat;

fn random(rng: &mut impl Rng, n: usize, range: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-range..range)).collect()
}

#[test]
fn a_q8_0_cache_attends_as_an_f32_cache_of_its_rounded_values() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(80);
    let head_dim = 64;
    // SmolLM2's GQA (3 query heads a KV head) and Gemma 3's (one KV head).
    for (n_heads, n_kv_heads, window, softcap) in [
        (6, 2, None, None),
        (4, 1, Some(40), Some(5.0f32)),
        (3, 1, Some(100), None),
    ] {
        let shape = AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            softcap,
        };
        // A prompt longer than a ring (pieces), decode steps, a chunk.
        let chunks = [300usize, 1, 1, 20, 1, 150];
        let total: usize = chunks.iter().sum();
        let (q_cols, kv_cols) = (n_heads * head_dim, n_kv_heads * head_dim);
        let q_all = random(&mut rng, total * q_cols, 3.0);
        let k_all = random(&mut rng, total * kv_cols, 3.0);
        let v_all = random(&mut rng, total * kv_cols, 1.0);
        let (k_rounded, v_rounded) = (round_q8(&k_all), round_q8(&v_all));
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            let pool = ThreadPool::new(2);
            let make = |dtype| {
                let kv = KvFormat::of(dtype);
                CpuKvCache::windowed(&kv, 1, n_kv_heads, head_dim, total + 7, &[window])
                    .expect("an unlimited pool holds the cache")
            };
            let (mut q8, mut f32_cache) = (make(KvType::Q8_0), make(KvType::F32));
            // 34 bytes per 32 elements against 4 per element.
            assert_eq!(
                q8.layout().bytes_beyond(0) * 128,
                f32_cache.layout().bytes_beyond(0) * 34
            );
            let mut start = 0;
            for n in chunks {
                let act = |data: &[f32], cols: usize| CpuActivations {
                    rows: n,
                    cols,
                    data: data[start * cols..(start + n) * cols].to_vec(),
                };
                let q = act(&q_all, q_cols);
                let mut outs = Vec::new();
                for (cache, k, v) in [
                    (&mut q8, &k_all, &v_all),
                    (&mut f32_cache, &k_rounded, &v_rounded),
                ] {
                    let (k, v) = (act(k, kv_cols), act(v, kv_cols));
                    let call = AttentionCall {
                        layer: 0,
                        shape,
                        q: &q,
                        k: &k,
                        v: &v,
                        products: Products::F32,
                    };
                    let mut out = CpuActivations::zeros(n, q_cols);
                    let (store, seq) = cache.rows(0..n, start, true).expect("the cache's blocks");
                    attention(&pool, isa, call, store, &[seq], &mut out)
                        .expect("attention over an allocated cache");
                    outs.push(out.data);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(&outs[0]) == bits(&outs[1]),
                    "{:?} window {window:?} chunk at {start}: q8_0 against f32",
                    isa.get()
                );
                start += n;
            }
            assert_eq!(q8.key(0, 0, total - 1), f32_cache.key(0, 0, total - 1));
            assert_eq!(q8.value(0, 0, total - 1), f32_cache.value(0, 0, total - 1));
        }
    }
}

#[test]
fn a_q8_0_cache_refuses_a_head_dim_off_its_groups() {
    let kv = KvFormat::of(KvType::Q8_0);
    match CpuKvCache::windowed(&kv, 2, 1, 80, 64, &[]) {
        Err(e) => assert!(e.to_string().contains("head_dim is 80"), "{e}"),
        Ok(_) => panic!("a q8_0 cache of head_dim 80 was made"),
    }
}
