//! A Llama decoder run through the `Backend` trait alone (Llama-7B shapes
//! on the GPU, tiny ones on the CPU), its F16 weights generated from a seed
//! and exported as a Hugging Face folder (`config.json`,
//! `model.safetensors`): `transformers` loads the very weights the backend
//! ran for the tokens/s comparison and checks the logits
//! (`scripts/gpu_check_torch.py`), NumPy does the same for the CPU's run of
//! the tiny shapes (`scripts/gpu_check_reference.py`, in the dry run).
//!
//! The layout is the Hugging Face Llama's: RMSNorm (weights of one), Q/K/V,
//! RoPE in halves (NeoX style, `rotate_half`), causal attention, O into the
//! residual; RMSNorm, SiLU(gate) · up, down into the residual; a final
//! RMSNorm and an untied `lm_head`.

use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::kv::{BlockTable, KvBlockShape, KvFormat};
use switchyard_kernels::{
    AttentionShape, Backend, DType, KernelError, KvLayout, KvType, MatmulInput, RopeStyle, StepKey,
    WeightView,
};

use super::step_parts::{product, sequence_rows};

pub type Error = Box<dyn std::error::Error>;

/// A Llama's shapes (as many KV heads as query heads).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub layers: usize,
    pub d: usize,
    pub ff: usize,
    pub vocab: usize,
    pub heads: usize,
    pub head_dim: usize,
}

pub const LLAMA_7B: Dims = Dims {
    layers: 32,
    d: 4096,
    ff: 11008,
    vocab: 32000,
    heads: 32,
    head_dim: 128,
};

/// Small enough for the CPU's scalar kernels and NumPy in a second; head
/// size 64 so that the CUDA kernels could run it too.
pub const TINY: Dims = Dims {
    layers: 2,
    d: 256,
    ff: 512,
    vocab: 384,
    heads: 4,
    head_dim: 64,
};

/// The seed of the exported weights (the decode runs use the same).
pub const SEED: u64 = 71;
const EPS: f32 = 1e-5;
const THETA: f32 = 10000.0;
/// The prompt length of every run here.
pub const PROMPT: usize = 16;

/// A layer's matrices by their Hugging Face names under `model.layers.N.`.
const MATRICES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

impl Dims {
    /// (rows, cols) of a layer's matrix `i` (of `MATRICES`).
    fn shape(&self, i: usize) -> (usize, usize) {
        match i {
            0..=3 => (self.d, self.d),
            4 | 5 => (self.ff, self.d),
            _ => (self.d, self.ff),
        }
    }
}

/// A checkpoint's weights as F16 bytes. Every layer cuts its matrices from
/// one pool of random values, each matrix at its own offset: a 7B
/// checkpoint costs 0.4 GB of random numbers, not 13 (values do not matter
/// to speed, and the logits checks run the same bytes on both sides).
pub struct Weights {
    pub dims: Dims,
    pool: Bytes,
    embed: Bytes,
    lm_head: Bytes,
}

fn random_f16(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Bytes {
    let bytes: Vec<u8> = (0..n)
        .flat_map(|_| half::f16::from_f32(rng.random_range(-scale..scale)).to_le_bytes())
        .collect();
    bytes.into()
}

/// Where matrix `i` of a layer starts in the pool, in values.
fn pool_offset(dims: &Dims, i: usize) -> usize {
    i * 16 * dims.d
}

impl Weights {
    pub fn generate(dims: Dims, seed: u64) -> Weights {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Uniform in ±1/√d: a product of a normalized row keeps a spread of
        // about 0.6, so 32 layers stay finite in F16.
        let scale = 1.0 / (dims.d as f32).sqrt();
        let pool_len = pool_offset(&dims, MATRICES.len()) + dims.ff * dims.d;
        Weights {
            dims,
            pool: random_f16(&mut rng, pool_len, scale),
            embed: random_f16(&mut rng, dims.vocab * dims.d, 1.0),
            lm_head: random_f16(&mut rng, dims.vocab * dims.d, scale),
        }
    }

    /// A layer's matrix `i`: rows, cols and bytes (the same in every layer).
    fn layer_matrix(&self, i: usize) -> (usize, usize, Bytes) {
        let (rows, cols) = self.dims.shape(i);
        let start = pool_offset(&self.dims, i) * 2;
        (rows, cols, self.pool.slice(start..start + rows * cols * 2))
    }

    /// Every tensor under its Hugging Face name, in file order: name,
    /// shape, F16 bytes.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>, Bytes)> {
        let Dims { d, vocab, .. } = self.dims;
        let ones: Vec<u8> = (0..d).flat_map(|_| half::f16::ONE.to_le_bytes()).collect();
        let ones = Bytes::from(ones);
        let mut t = vec![(
            "model.embed_tokens.weight".to_string(),
            vec![vocab, d],
            self.embed.clone(),
        )];
        for l in 0..self.dims.layers {
            let norm = format!("model.layers.{l}.input_layernorm.weight");
            t.push((norm, vec![d], ones.clone()));
            for (i, name) in MATRICES.iter().enumerate() {
                let (rows, cols, bytes) = self.layer_matrix(i);
                t.push((
                    format!("model.layers.{l}.{name}.weight"),
                    vec![rows, cols],
                    bytes,
                ));
            }
            let norm = format!("model.layers.{l}.post_attention_layernorm.weight");
            t.push((norm, vec![d], ones.clone()));
        }
        t.push(("model.norm.weight".to_string(), vec![d], ones));
        t.push((
            "lm_head.weight".to_string(),
            vec![vocab, d],
            self.lm_head.clone(),
        ));
        t
    }

    /// Writes `config.json` and `model.safetensors` (F16) into `dir`,
    /// created if missing; returns the weight file's size.
    pub fn export(&self, dir: &Path) -> Result<u64, Error> {
        std::fs::create_dir_all(dir)?;
        let Dims {
            layers,
            d,
            ff,
            vocab,
            heads,
            head_dim,
        } = self.dims;
        let config = format!(
            "{{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\
             \"hidden_size\":{d},\"intermediate_size\":{ff},\"num_hidden_layers\":{layers},\
             \"num_attention_heads\":{heads},\"num_key_value_heads\":{heads},\"head_dim\":{head_dim},\
             \"vocab_size\":{vocab},\"rms_norm_eps\":{EPS:e},\"rope_theta\":{THETA:.1},\
             \"max_position_embeddings\":4096,\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\
             \"attention_bias\":false,\"mlp_bias\":false,\"torch_dtype\":\"float16\",\
             \"bos_token_id\":1,\"eos_token_id\":2}}\n"
        );
        std::fs::write(dir.join("config.json"), config)?;
        let tensors = self.tensors();
        let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
        let mut offset = 0usize;
        for (name, shape, bytes) in &tensors {
            let end = offset + bytes.len();
            header.push_str(&format!(
                ",{name:?}:{{\"dtype\":\"F16\",\"shape\":{shape:?},\"data_offsets\":[{offset},{end}]}}"
            ));
            offset = end;
        }
        header.push('}');
        // The format pads its header with spaces to 8 bytes.
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let file = std::fs::File::create(dir.join("model.safetensors"))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 22, file);
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(header.as_bytes())?;
        for (_, _, bytes) in &tensors {
            w.write_all(bytes)?;
        }
        w.flush()?;
        Ok((8 + header.len() + offset) as u64)
    }
}

/// The weights on a backend.
pub struct Model<B: Backend> {
    pub dims: Dims,
    embed: B::Matrix,
    lm_head: B::Matrix,
    layers: Vec<Vec<B::Matrix>>,
    ones: B::Vector,
    inv_freq: Vec<f32>,
}

/// A batch's KV blocks and a step's activations, kept across steps as the
/// engine keeps its scratch: a captured step replays over the same
/// addresses.
pub struct Batch<B: Backend> {
    store: B::KvStore,
    tables: Vec<BlockTable>,
    bufs: [B::Activations; 9],
    staging: Vec<f32>,
}

/// `out = rmsnorm(x)` (weights of one) as the input of a matmul.
fn norm<'a, B: Backend>(
    x: &'a B::Activations,
    ones: &'a B::Vector,
    out: &'a mut B::Activations,
) -> MatmulInput<'a, B> {
    MatmulInput::RmsNorm {
        x,
        weight: ones,
        eps: EPS,
        out,
    }
}

impl<B: Backend> Model<B> {
    pub fn upload(b: &B, w: &Weights) -> Result<Model<B>, Error> {
        let dims = w.dims;
        let f16 = |rows, cols, bytes| WeightView::new(DType::F16, rows, cols, bytes);
        let mut layers = Vec::with_capacity(dims.layers);
        for _ in 0..dims.layers {
            let mut m = Vec::with_capacity(MATRICES.len());
            for i in 0..MATRICES.len() {
                let (rows, cols, bytes) = w.layer_matrix(i);
                m.push(b.matrix(f16(rows, cols, bytes)?)?);
            }
            layers.push(m);
        }
        let hd = dims.head_dim;
        Ok(Model {
            dims,
            embed: b.matrix(f16(dims.vocab, dims.d, w.embed.clone())?)?,
            lm_head: b.matrix(f16(dims.vocab, dims.d, w.lm_head.clone())?)?,
            layers,
            ones: b.vector(&vec![1.0; dims.d])?,
            inv_freq: (0..hd / 2)
                .map(|i| THETA.powf(-2.0 * i as f32 / hd as f32))
                .collect(),
        })
    }

    /// The widths of `Batch::bufs`: h, n, q, k, v, att, gate, up, logits.
    fn widths(&self) -> [usize; 9] {
        let Dims { d, ff, vocab, .. } = self.dims;
        [d, d, d, d, d, d, ff, ff, vocab]
    }

    /// A store and block tables for `sequences` sequences of up to
    /// `capacity` positions each (the engine's part, done here by hand).
    pub fn batch(&self, b: &B, sequences: usize, capacity: usize) -> Result<Batch<B>, Error> {
        let Dims {
            layers,
            heads,
            head_dim,
            ..
        } = self.dims;
        let format = KvFormat::new(KvType::F16, 1024);
        let layout = KvLayout::new(format, layers, heads, head_dim, capacity, &[])?;
        let mut store = b.kv_store(format, usize::MAX)?;
        let mut tables = Vec::with_capacity(sequences);
        for _ in 0..sequences {
            let mut table = BlockTable::new(layout.clone());
            for layer in 0..layers {
                for _ in 0..table.blocks_for(layer, layout.capacity()) {
                    let block = KvBlockShape {
                        dtype: KvType::F16,
                        n_kv_heads: heads,
                        head_dim,
                        positions: layout.block_positions(),
                    };
                    let id = b.kv_alloc(&mut store, block)?;
                    table.push(layer, id)?;
                }
            }
            tables.push(table);
        }
        Ok(Batch {
            store,
            tables,
            bufs: self.widths().map(|w| b.activations(1, w)),
            staging: Vec::new(),
        })
    }

    /// One step: the rows of `tokens` at `positions`, `per_seq` rows for
    /// each sequence of the batch in turn; every row's logits on the host.
    /// A keyed step that fails runs again without its key, as the engine's.
    pub fn step(
        &self,
        b: &B,
        batch: &mut Batch<B>,
        tokens: &[u32],
        positions: &[u32],
        per_seq: usize,
        key: Option<StepKey>,
    ) -> Result<Vec<f32>, Error> {
        let logits = match self.forward(b, batch, tokens, positions, per_seq, key) {
            Err(_) if key.is_some() => self.forward(b, batch, tokens, positions, per_seq, None)?,
            other => other?,
        };
        if logits.iter().any(|x| !x.is_finite()) {
            return Err("non-finite logits".into());
        }
        Ok(logits)
    }

    fn forward(
        &self,
        b: &B,
        batch: &mut Batch<B>,
        tokens: &[u32],
        positions: &[u32],
        per_seq: usize,
        key: Option<StepKey>,
    ) -> Result<Vec<f32>, KernelError> {
        let Dims {
            heads, head_dim, ..
        } = self.dims;
        let shape = AttentionShape {
            n_heads: heads,
            n_kv_heads: heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        };
        let Batch {
            store,
            tables,
            bufs,
            staging,
        } = batch;
        for (x, cols) in bufs.iter_mut().zip(self.widths()) {
            b.resize(x, tokens.len(), cols);
        }
        let [h, n, q, k, v, att, g, u, logits] = bufs;
        b.begin_step(key);
        let step = (|| -> Result<(), KernelError> {
            b.embed(&self.embed, tokens, h)?;
            for (layer, w) in self.layers.iter().enumerate() {
                b.matmul_many(
                    norm::<B>(h, &self.ones, n),
                    &mut [
                        product::<B>(&w[0], q, false),
                        product::<B>(&w[1], k, false),
                        product::<B>(&w[2], v, false),
                    ],
                )?;
                b.rope(q, head_dim, positions, &self.inv_freq, RopeStyle::Neox)?;
                b.rope(k, head_dim, positions, &self.inv_freq, RopeStyle::Neox)?;
                let seqs = sequence_rows(tables, positions, per_seq);
                b.attention(layer, shape, q, k, v, store, &seqs, att)?;
                b.matmul_many(MatmulInput::Rows(att), &mut [product::<B>(&w[3], h, true)])?;
                b.matmul_many(
                    norm::<B>(h, &self.ones, n),
                    &mut [product::<B>(&w[4], g, false), product::<B>(&w[5], u, false)],
                )?;
                b.matmul_many(
                    MatmulInput::SiluMul { gate: g, up: u },
                    &mut [product::<B>(&w[6], h, true)],
                )?;
            }
            b.rms_norm(h, &self.ones, EPS, n)?;
            b.matmul(n, &self.lm_head, None, logits)?;
            b.end_step()
        })();
        if let Err(e) = step {
            b.abort_step();
            return Err(e);
        }
        Ok(b.host_rows(logits, staging).to_vec())
    }

    /// The logits checks' run: one sequence, a prompt of `PROMPT` tokens,
    /// then one decode step. Returns the `PROMPT + 1` tokens and the
    /// logits of the prompt's last row and of the decode row.
    pub fn reference_rows(&self, b: &B) -> Result<(Vec<u32>, Vec<Vec<f32>>), Error> {
        let vocab = self.dims.vocab;
        let tokens: Vec<u32> = (0..=PROMPT).map(|i| ((i * 7 + 3) % vocab) as u32).collect();
        let mut batch = self.batch(b, 1, PROMPT + 1)?;
        let positions: Vec<u32> = (0..PROMPT as u32).collect();
        let prompt = self.step(b, &mut batch, &tokens[..PROMPT], &positions, PROMPT, None)?;
        let last = prompt[(PROMPT - 1) * vocab..].to_vec();
        let decode = self.step(b, &mut batch, &tokens[PROMPT..], &[PROMPT as u32], 1, None)?;
        Ok((tokens, vec![last, decode]))
    }
}

/// `switchyard_logits.json` in `dir`: the tokens and the two rows of
/// [`Model::reference_rows`], which the Python side recomputes.
pub fn write_logits(dir: &Path, tokens: &[u32], rows: &[Vec<f32>]) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let rows: Vec<String> = rows
        .iter()
        .map(|r| {
            let v: Vec<String> = r.iter().map(|x| format!("{x:e}")).collect();
            format!("[{}]", v.join(","))
        })
        .collect();
    let json = format!(
        "{{\"tokens\":{tokens:?},\"rows\":[{}],\"positions\":[{},{}]}}\n",
        rows.join(","),
        PROMPT - 1,
        PROMPT
    );
    std::fs::write(dir.join("switchyard_logits.json"), json)?;
    Ok(())
}
