//! Step graphs as the serving path uses them, at small shapes (so that
//! `--quick` runs them under compute-sanitizer): a two-layer model with
//! GQA, Q4_K layers, a Q8_0 embedding and a Q6_K output, stepped through
//! the `Backend` trait by one generic function on the CPU (the oracle) and
//! on the GPU twice per step, eagerly and keyed (captured at the key's
//! second step, replayed after). Keyed logits must equal eager ones bit
//! for bit (same launches, same addresses); both must be within
//! `LOGITS_TOL` of the CPU's.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cpu::{CpuBackend, Isa};
use switchyard_kernels::cuda::{CudaBackend, CudaConfig};
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::kv::{BlockTable, KvBlockShape, KvFormat};
use switchyard_kernels::{
    AttentionShape, Backend, DType, KernelError, KvLayout, KvType, MatmulInput, RopeStyle, StepKey,
    WeightView,
};

use super::step_parts::{product, sequence_rows};
use super::{random_values, Check};

const D: usize = 256;
const FF: usize = 512;
const VOCAB: usize = 512;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 64;
/// Relative to the largest CPU logit: both sides quantize rows to 8 bits
/// per block (the same contract), only the order of sums differs, and a
/// wrong launch is off by O(1).
const LOGITS_TOL: f32 = 1e-3;

struct Mini<B: Backend> {
    embed: B::Matrix,
    layers: Vec<Vec<B::Matrix>>,
    ones_d: B::Vector,
    ones_hd: B::Vector,
    head: B::Matrix,
}

/// (rows, cols) of q, k, v, o, gate, up, down.
const SHAPES: [(usize, usize); 7] = [
    (HEADS * HD, D),
    (KV_HEADS * HD, D),
    (KV_HEADS * HD, D),
    (D, HEADS * HD),
    (FF, D),
    (FF, D),
    (D, FF),
];

fn mini<B: Backend>(b: &B) -> Result<Mini<B>, Box<dyn std::error::Error>> {
    let mut rng = ChaCha8Rng::seed_from_u64(343);
    let mut m = |dtype: DType, rows: usize, cols: usize, scale: f32| {
        let bytes = quantize(dtype, &random_values(rows * cols, &mut rng, scale))?;
        Ok::<_, Box<dyn std::error::Error>>(b.matrix(WeightView::new(
            dtype,
            rows,
            cols,
            bytes.into(),
        )?)?)
    };
    let embed = m(DType::Q8_0, VOCAB, D, 1.0)?;
    let mut layers = Vec::new();
    for _ in 0..LAYERS {
        let l: Result<Vec<_>, _> = SHAPES
            .iter()
            .map(|(r, c)| m(DType::Q4K, *r, *c, 0.1))
            .collect();
        layers.push(l?);
    }
    let head = m(DType::Q6K, VOCAB, D, 0.5)?;
    Ok(Mini {
        embed,
        layers,
        ones_d: b.vector(&[1.0; D])?,
        ones_hd: b.vector(&[1.0; HD])?,
        head,
    })
}

struct Bufs<B: Backend> {
    x: [B::Activations; 9],
}

impl<B: Backend> Bufs<B> {
    const COLS: [usize; 9] = [
        D,
        D,
        HEADS * HD,
        KV_HEADS * HD,
        KV_HEADS * HD,
        HEADS * HD,
        FF,
        FF,
        VOCAB,
    ];

    fn new(b: &B) -> Self {
        Bufs {
            x: Self::COLS.map(|c| b.activations(1, c)),
        }
    }
}

/// One step over every sequence's `per_seq` rows, opened with `key`;
/// returns the logits of every row.
#[allow(clippy::too_many_arguments)]
fn step<B: Backend>(
    b: &B,
    m: &Mini<B>,
    bufs: &mut Bufs<B>,
    store: &mut B::KvStore,
    tables: &[BlockTable],
    tokens: &[u32],
    positions: &[u32],
    per_seq: usize,
    key: Option<StepKey>,
) -> Result<Vec<f32>, KernelError> {
    let rows = tokens.len();
    for (x, cols) in bufs.x.iter_mut().zip(Bufs::<B>::COLS) {
        b.resize(x, rows, cols);
    }
    let [h, n, q, k, v, att, g, u, logits] = &mut bufs.x;
    let inv_freq: Vec<f32> = (0..HD / 2)
        .map(|i| 10000f32.powf(-2.0 * i as f32 / HD as f32))
        .collect();
    let shape = AttentionShape {
        n_heads: HEADS,
        n_kv_heads: KV_HEADS,
        head_dim: HD,
        scale: 1.0 / (HD as f32).sqrt(),
        window: None,
        softcap: None,
    };
    b.begin_step(key);
    let run = (|| -> Result<(), KernelError> {
        b.embed(&m.embed, tokens, h)?;
        for (layer, w) in m.layers.iter().enumerate() {
            b.matmul_many(
                MatmulInput::RmsNorm {
                    x: h,
                    weight: &m.ones_d,
                    eps: 1e-5,
                    out: n,
                },
                &mut [
                    product(&w[0], q, false),
                    product(&w[1], k, false),
                    product(&w[2], v, false),
                ],
            )?;
            b.rms_norm_heads(q, &m.ones_hd, 1e-6)?;
            b.rope(q, HD, positions, &inv_freq, RopeStyle::Neox)?;
            b.rope(k, HD, positions, &inv_freq, RopeStyle::Neox)?;
            let seqs = sequence_rows(tables, positions, per_seq);
            b.attention(layer, shape, q, k, v, store, &seqs, att)?;
            b.matmul_many(MatmulInput::Rows(att), &mut [product(&w[3], h, true)])?;
            b.matmul_many(
                MatmulInput::RmsNorm {
                    x: h,
                    weight: &m.ones_d,
                    eps: 1e-5,
                    out: n,
                },
                &mut [product(&w[4], g, false), product(&w[5], u, false)],
            )?;
            b.matmul_many(
                MatmulInput::SiluMul { gate: g, up: u },
                &mut [product(&w[6], h, true)],
            )?;
        }
        b.rms_norm(h, &m.ones_d, 1e-5, n)?;
        b.matmul(n, &m.head, None, logits)?;
        b.softcap(logits, 30.0)?;
        b.end_step()
    })();
    if let Err(e) = run {
        b.abort_step();
        return Err(e);
    }
    let mut staging = Vec::new();
    Ok(b.host_rows(logits, &mut staging).to_vec())
}

/// A store and each sequence's blocks for `capacity` positions.
fn kv<B: Backend>(
    b: &B,
    seqs: usize,
    capacity: usize,
) -> Result<(B::KvStore, Vec<BlockTable>), Box<dyn std::error::Error>> {
    let format = KvFormat::new(KvType::F16, 64);
    let layout = KvLayout::new(format, LAYERS, KV_HEADS, HD, capacity, &[])?;
    let mut store = b.kv_store(format, usize::MAX)?;
    let mut tables = Vec::new();
    for _ in 0..seqs {
        let mut table = BlockTable::new(layout.clone());
        for layer in 0..LAYERS {
            for _ in 0..table.blocks_for(layer, layout.capacity()) {
                let shape = KvBlockShape {
                    dtype: KvType::F16,
                    n_kv_heads: KV_HEADS,
                    head_dim: HD,
                    positions: layout.block_positions(),
                };
                let id = b.kv_alloc(&mut store, shape)?;
                table.push(layer, id)?;
            }
        }
        tables.push(table);
    }
    Ok((store, tables))
}

fn rel_err(got: &[f32], expected: &[f32]) -> f32 {
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    got.iter()
        .zip(expected)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// See the module documentation: `steps` decode steps of `seqs` sequences
/// after a prompt of 4 tokens each (crossing a 32-position unit at 32).
pub fn graphs_against_eager(seqs: usize, steps: usize) -> Check {
    let gpu = CudaBackend::open(CudaConfig::default())?;
    let cpu = CpuBackend::with_isa(1, Isa::Scalar);
    let (mg, mc) = (mini(&gpu)?, mini(&cpu)?);
    let prompt = 4;
    let capacity = prompt + steps + 1;
    let ((mut sg, tg), (mut sc, tc)) = (kv(&gpu, seqs, capacity)?, kv(&cpu, seqs, capacity)?);
    let (mut bg, mut bc) = (Bufs::new(&gpu), Bufs::new(&cpu));
    let tokens: Vec<u32> = (0..seqs * prompt)
        .map(|i| (i * 37 % VOCAB) as u32)
        .collect();
    let positions: Vec<u32> = (0..seqs * prompt).map(|i| (i % prompt) as u32).collect();
    step(
        &gpu, &mg, &mut bg, &mut sg, &tg, &tokens, &positions, prompt, None,
    )?;
    step(
        &cpu, &mc, &mut bc, &mut sc, &tc, &tokens, &positions, prompt, None,
    )?;
    let key = Some(StepKey(seqs as u64));
    let (mut differing, mut worst) = (0usize, 0f32);
    let before = gpu.graph_stats();
    for s in 0..steps {
        let tokens: Vec<u32> = (0..seqs)
            .map(|i| ((i * 5 + s * 11) % VOCAB) as u32)
            .collect();
        let positions = vec![(prompt + s) as u32; seqs];
        let eager = step(
            &gpu, &mg, &mut bg, &mut sg, &tg, &tokens, &positions, 1, None,
        )?;
        let keyed = match step(
            &gpu, &mg, &mut bg, &mut sg, &tg, &tokens, &positions, 1, key,
        ) {
            Err(KernelError::StepDiverged(_)) => step(
                &gpu, &mg, &mut bg, &mut sg, &tg, &tokens, &positions, 1, None,
            )?,
            other => other?,
        };
        let oracle = step(
            &cpu, &mc, &mut bc, &mut sc, &tc, &tokens, &positions, 1, None,
        )?;
        differing += usize::from(keyed != eager);
        worst = worst
            .max(rel_err(&keyed, &oracle))
            .max(rel_err(&eager, &oracle));
    }
    let stats = gpu.graph_stats();
    let (captures, replays) = (
        stats.captures - before.captures,
        stats.replays - before.replays,
    );
    let pass =
        differing == 0 && worst <= LOGITS_TOL && captures >= 1 && replays >= steps as u64 / 2;
    println!(
        "{{\"check\":\"serving_graphs\",\"seqs\":{seqs},\"steps\":{steps},\"keyed_differing_from_eager\":{differing},\"max_rel_vs_cpu\":{worst:e},\"tolerance\":{LOGITS_TOL:e},\"captures\":{captures},\"replays\":{replays},\"divergences\":{},\"staged_bytes\":{},\"pass\":{pass}}}",
        stats.divergences - before.divergences,
        gpu.staged_bytes()
    );
    Ok(pass)
}
