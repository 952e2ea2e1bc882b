//! Writing adapters: a PEFT folder and a llama.cpp GGUF adapter from one
//! [`LoraSet`] (the project's own converter, used by the tests, by
//! `switchyard adapter convert` and by `scripts/train-lora.py`'s output
//! check). The GGUF form permutes Q and K rows as `convert_lora_to_gguf.py`
//! does for Llama-family bases.

use std::path::Path;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::DType;

use super::order::{reorder_columns, RowOrder};
use super::peft::{CONFIG_FILE, WEIGHTS_FILE};
use super::target::Target;
use super::AdapterError;
use crate::formats::gguf::{GgufWriter, MetaValue};
use crate::model::config::{Architecture, ModelConfig};

/// One weight's pair as a trainer holds it, in Hugging Face row order.
#[derive(Clone, Debug)]
pub struct LoraPair {
    pub layer: usize,
    pub target: Target,
    pub rank: usize,
    /// `rank × in`.
    pub a: Vec<f32>,
    /// `out × rank`.
    pub b: Vec<f32>,
}

/// An adapter's pairs and its `alpha` (the scale is `alpha / rank`).
#[derive(Clone, Debug)]
pub struct LoraSet {
    pub alpha: f32,
    pub pairs: Vec<LoraPair>,
}

impl LoraSet {
    /// A random adapter of `rank` on `targets` of every layer of
    /// `config`, values uniform in `±magnitude` (a test's adapter: its
    /// update is of the base's size without drowning it).
    pub fn random(
        config: &ModelConfig,
        rank: usize,
        targets: &[Target],
        seed: u64,
        magnitude: f32,
    ) -> LoraSet {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut pairs = Vec::new();
        for layer in 0..config.n_layers {
            for &target in targets {
                let (input, output) = target.dims(config);
                let mut values = |n: usize| -> Vec<f32> {
                    (0..n)
                        .map(|_| rng.random_range(-magnitude..magnitude))
                        .collect()
                };
                pairs.push(LoraPair {
                    layer,
                    target,
                    rank,
                    a: values(rank * input),
                    b: values(output * rank),
                });
            }
        }
        LoraSet {
            alpha: 2.0 * rank as f32,
            pairs,
        }
    }

    /// Writes the PEFT folder form (`dtype`: F32, F16 or BF16).
    pub fn write_peft(&self, dir: &Path, dtype: DType) -> Result<(), AdapterError> {
        let unwritable = |reason: String| AdapterError::BadConfig {
            path: dir.to_path_buf(),
            reason: format!("cannot write the adapter: {reason}"),
        };
        let st = match dtype {
            DType::F32 => Dtype::F32,
            DType::F16 => Dtype::F16,
            DType::BF16 => Dtype::BF16,
            other => return Err(unwritable(format!("PEFT files hold floats, not {other}"))),
        };
        std::fs::create_dir_all(dir).map_err(|source| AdapterError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut named = Vec::new();
        for p in &self.pairs {
            let module = format!(
                "base_model.model.model.layers.{}.{}.{}",
                p.layer,
                if matches!(p.target, Target::Gate | Target::Up | Target::Down) {
                    "mlp"
                } else {
                    "self_attn"
                },
                p.target.peft()
            );
            let (input, output) = (p.a.len() / p.rank.max(1), p.b.len() / p.rank.max(1));
            let a = quantize(dtype, &p.a).map_err(|e| unwritable(e.to_string()))?;
            let b = quantize(dtype, &p.b).map_err(|e| unwritable(e.to_string()))?;
            named.push((format!("{module}.lora_A.weight"), vec![p.rank, input], a));
            named.push((format!("{module}.lora_B.weight"), vec![output, p.rank], b));
        }
        let views = named
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(st, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| unwritable(format!("{name}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        safetensors::serialize_to_file(views, None, &dir.join(WEIGHTS_FILE))
            .map_err(|e| unwritable(e.to_string()))?;
        let mut targets: Vec<&str> = self.pairs.iter().map(|p| p.target.peft()).collect();
        targets.sort_unstable();
        targets.dedup();
        let rank = self.pairs.first().map_or(0, |p| p.rank);
        let config = serde_json::json!({
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": self.alpha,
            "target_modules": targets,
            "bias": "none",
            "use_rslora": false,
            "use_dora": false,
            "fan_in_fan_out": false,
        });
        let text = serde_json::to_string_pretty(&config).map_err(|e| unwritable(e.to_string()))?;
        std::fs::write(dir.join(CONFIG_FILE), text).map_err(|source| AdapterError::Io {
            path: dir.join(CONFIG_FILE),
            source,
        })
    }

    /// Writes the llama.cpp GGUF form for a base of `config` (`dtype`:
    /// F32, F16, BF16 or Q8_0; Q8_0 needs widths that are multiples of 32,
    /// so a `B` of a small rank stays F32 as llama.cpp's converter keeps
    /// it).
    pub fn write_gguf(
        &self,
        path: &Path,
        config: &ModelConfig,
        dtype: DType,
    ) -> Result<(), AdapterError> {
        let unwritable = |reason: String| AdapterError::BadConfig {
            path: path.to_path_buf(),
            reason: format!("cannot write the adapter: {reason}"),
        };
        let arch = config.architecture;
        let mut w = GgufWriter::new(path);
        w.add_metadata(
            "general.architecture",
            MetaValue::String(arch.name().into()),
        );
        w.add_metadata("general.type", MetaValue::String("adapter".into()));
        w.add_metadata("adapter.type", MetaValue::String("lora".into()));
        w.add_metadata("adapter.lora.alpha", MetaValue::F32(self.alpha));
        let permuted = matches!(arch, Architecture::Llama | Architecture::Mistral);
        for p in &self.pairs {
            let (input, output) = (p.a.len() / p.rank.max(1), p.b.len() / p.rank.max(1));
            let mut b = p.b.clone();
            if permuted && matches!(p.target, Target::Q | Target::K) {
                // Bᵀ's columns are B's rows: reorder there, transpose back.
                let mut b_t = vec![0.0; b.len()];
                for (o, row) in b.chunks(p.rank).enumerate() {
                    for (r, v) in row.iter().enumerate() {
                        b_t[r * output + o] = *v;
                    }
                }
                let b_t = reorder_columns(
                    &b_t,
                    output,
                    config.head_dim,
                    RowOrder::Halves,
                    RowOrder::Pairs,
                );
                for (o, row) in b.chunks_mut(p.rank).enumerate() {
                    for (r, v) in row.iter_mut().enumerate() {
                        *v = b_t[r * output + o];
                    }
                }
            }
            let name = format!("blk.{}.{}.weight", p.layer, p.target.gguf());
            for (suffix, values, shape) in [
                ("lora_a", &p.a, [p.rank, input]),
                ("lora_b", &b, [output, p.rank]),
            ] {
                let fits = shape[1] % dtype.block_len() == 0;
                let t = if fits { dtype } else { DType::F32 };
                let bytes = quantize(t, values).map_err(|e| unwritable(e.to_string()))?;
                w.add_tensor(format!("{name}.{suffix}"), t, &shape, Bytes::from(bytes))?;
            }
        }
        w.write()?;
        Ok(())
    }
}
