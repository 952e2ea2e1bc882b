//! An adapter in host memory, in the one shape both file formats load
//! into: per layer and target, `A` (`rank × in`) and `Bᵀ` (`rank × out`)
//! in f32, the expand's columns in the base's row order, and the scale.

use std::path::{Path, PathBuf};

use switchyard_kernels::{formats::dequantize_row, DType};

use super::order::{reorder_columns, RowOrder};
use super::target::{Target, TARGETS};
use super::AdapterError;
use crate::formats::TensorData;
use crate::model::config::ModelConfig;

/// The largest rank a step takes (the CPU kernel refuses more).
pub const MAX_RANK: usize = 256;

/// Which file form an adapter came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterFormat {
    Peft,
    Gguf,
}

/// One weight's low-rank update: `W x + scale · B (A x)`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraWeight {
    pub rank: usize,
    pub scale: f32,
    /// `rank × in`, row-major.
    pub a: Vec<f32>,
    /// `rank × out`, row-major: `B` transposed.
    pub b_t: Vec<f32>,
}

/// A loaded, validated adapter.
#[derive(Clone, Debug)]
pub struct AdapterWeights {
    pub source: PathBuf,
    pub format: AdapterFormat,
    /// `layers[l][target.index()]`: the update of that weight, if any.
    pub layers: Vec<[Option<LoraWeight>; 7]>,
    /// A hash of every value and scale: equal adapters share prompt-cache
    /// blocks whatever their names, different ones never do.
    pub identity: u64,
}

impl AdapterWeights {
    /// Bytes its tensors take here, in f32 (resident, they take half:
    /// `ResidentAdapter::bytes`).
    pub fn bytes(&self) -> u64 {
        self.weights()
            .map(|(_, _, w)| ((w.a.len() + w.b_t.len()) * 4) as u64)
            .sum()
    }

    /// Every update with its layer and target.
    pub fn weights(&self) -> impl Iterator<Item = (usize, Target, &LoraWeight)> {
        self.layers.iter().enumerate().flat_map(|(l, targets)| {
            TARGETS
                .iter()
                .zip(targets)
                .filter_map(move |(t, w)| w.as_ref().map(|w| (l, *t, w)))
        })
    }

    /// The largest rank of any update.
    pub fn max_rank(&self) -> usize {
        self.weights().map(|(_, _, w)| w.rank).max().unwrap_or(0)
    }
}

/// One `A`/`B` pair as a file holds it, before validation.
pub(super) struct RawPair<'a> {
    pub layer: usize,
    pub target: Target,
    pub a_name: &'a str,
    pub a: &'a TensorData,
    pub b_name: &'a str,
    pub b: &'a TensorData,
    /// `alpha` for this weight; the scale is `alpha / rank` (`0`: scale 1,
    /// as llama.cpp reads an adapter without alpha).
    pub alpha: f32,
    /// rsLoRA: `alpha / √rank`.
    pub rs_lora: bool,
    /// The declared rank, when the file's config gives one, checked
    /// against the tensors.
    pub declared_rank: Option<usize>,
}

/// Builds [`AdapterWeights`] pair by pair against the base's shapes.
pub(super) struct Collector<'c> {
    pub path: &'c Path,
    pub config: &'c ModelConfig,
    /// Row order of the file's Q and K expands, and the base's.
    pub file_order: RowOrder,
    pub base_order: RowOrder,
    pub layers: Vec<[Option<LoraWeight>; 7]>,
}

impl<'c> Collector<'c> {
    pub fn new(
        path: &'c Path,
        config: &'c ModelConfig,
        file_order: RowOrder,
        base_order: RowOrder,
    ) -> Self {
        Collector {
            path,
            config,
            file_order,
            base_order,
            layers: (0..config.n_layers).map(|_| Default::default()).collect(),
        }
    }

    pub fn add(&mut self, p: RawPair<'_>) -> Result<(), AdapterError> {
        let (input, output) = p.target.dims(self.config);
        let bad = |tensor: &str, shape: &[usize], expected: String| AdapterError::BadShape {
            path: self.path.to_path_buf(),
            tensor: tensor.to_string(),
            shape: shape.to_vec(),
            expected,
        };
        let n_layers = self.config.n_layers;
        if p.layer >= n_layers {
            return Err(AdapterError::WrongBase {
                path: self.path.to_path_buf(),
                adapter: format!(
                    "a model with at least {} layers ({})",
                    p.layer + 1,
                    p.a_name
                ),
                base: format!("a model of {n_layers} layers"),
            });
        }
        let &[rank, a_in] = p.a.shape.as_slice() else {
            return Err(bad(p.a_name, &p.a.shape, format!("[rank, {input}]")));
        };
        if rank == 0 {
            return Err(AdapterError::RankZero {
                path: self.path.to_path_buf(),
                tensor: p.a_name.to_string(),
            });
        }
        if a_in != input {
            return Err(bad(p.a_name, &p.a.shape, format!("[{rank}, {input}]")));
        }
        if p.b.shape != [output, rank] {
            return Err(bad(p.b_name, &p.b.shape, format!("[{output}, {rank}]")));
        }
        if rank > MAX_RANK {
            return Err(AdapterError::RankTooLarge {
                path: self.path.to_path_buf(),
                tensor: p.a_name.to_string(),
                rank,
                max: MAX_RANK,
            });
        }
        if let Some(declared) = p.declared_rank.filter(|&d| d != rank) {
            return Err(bad(
                p.a_name,
                &p.a.shape,
                format!("rank {declared} as adapter_config.json declares"),
            ));
        }
        let a = self.floats(p.a_name, p.a, rank, input)?;
        let b = self.floats(p.b_name, p.b, output, rank)?;
        let mut b_t = vec![0.0f32; rank * output];
        for (o, row) in b.chunks(rank).enumerate() {
            for (r, v) in row.iter().enumerate() {
                b_t[r * output + o] = *v;
            }
        }
        if matches!(p.target, Target::Q | Target::K) {
            b_t = reorder_columns(
                &b_t,
                output,
                self.config.head_dim,
                self.file_order,
                self.base_order,
            );
        }
        let scale = if p.alpha == 0.0 {
            1.0
        } else if p.rs_lora {
            p.alpha / (rank as f32).sqrt()
        } else {
            p.alpha / rank as f32
        };
        let slot = &mut self.layers[p.layer][p.target.index()];
        if slot.is_some() {
            return Err(AdapterError::BadTensor {
                path: self.path.to_path_buf(),
                tensor: p.a_name.to_string(),
                reason: "the same weight is updated twice".into(),
            });
        }
        *slot = Some(LoraWeight {
            rank,
            scale,
            a,
            b_t,
        });
        Ok(())
    }

    /// A `rows × cols` tensor in f32.
    fn floats(
        &self,
        name: &str,
        t: &TensorData,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>, AdapterError> {
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0) {
            return Err(AdapterError::UnsupportedDtype {
                path: self.path.to_path_buf(),
                tensor: name.to_string(),
                dtype: t.dtype.to_string(),
            });
        }
        let bad = |reason: String| AdapterError::BadTensor {
            path: self.path.to_path_buf(),
            tensor: name.to_string(),
            reason,
        };
        let row_bytes = t.dtype.bytes_for(cols).ok_or_else(|| {
            bad(format!(
                "rows of {cols} {} elements are not whole blocks of {}",
                t.dtype,
                t.dtype.block_len()
            ))
        })?;
        if t.data.len() != row_bytes * rows {
            return Err(bad(format!(
                "holds {} bytes; {rows}×{cols} {} needs {}",
                t.data.len(),
                t.dtype,
                row_bytes * rows
            )));
        }
        let mut values = vec![0.0f32; rows * cols];
        for (bytes, out) in t.data.chunks(row_bytes.max(1)).zip(values.chunks_mut(cols)) {
            dequantize_row(t.dtype, bytes, out).map_err(|e| bad(e.to_string()))?;
        }
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(bad(format!("holds a non-finite value ({v})")));
        }
        Ok(values)
    }

    pub fn finish(self, format: AdapterFormat) -> Result<AdapterWeights, AdapterError> {
        let mut hasher = blake3::Hasher::new();
        let mut any = false;
        for (l, targets) in self.layers.iter().enumerate() {
            for (t, w) in targets.iter().enumerate() {
                let Some(w) = w else { continue };
                any = true;
                hasher.update(&(l as u64).to_le_bytes());
                hasher.update(&(t as u64).to_le_bytes());
                hasher.update(&w.scale.to_le_bytes());
                hasher.update(bytemuck::cast_slice(&w.a));
                hasher.update(bytemuck::cast_slice(&w.b_t));
            }
        }
        if !any {
            return Err(AdapterError::Empty {
                path: self.path.to_path_buf(),
            });
        }
        let digest = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest.as_bytes()[..8]);
        Ok(AdapterWeights {
            source: self.path.to_path_buf(),
            format,
            layers: self.layers,
            identity: u64::from_le_bytes(first),
        })
    }
}
