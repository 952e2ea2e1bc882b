//! One forward step over the chunks of one or more checkpoints.
//!
//! Checkpoints of one architecture can share a step: their rows are laid
//! one part after another, every operation whose tensor they share runs
//! once over all rows, and the few tensors that differ (a fine-tuned layer,
//! a delta) run per checkpoint on that checkpoint's rows (`runs.rs`). A
//! row's result does not depend on which other rows share its step: every
//! kernel computes each row on its own.

use std::ops::Range;

use std::hash::{DefaultHasher, Hash, Hasher};

use smallvec::SmallVec;
use switchyard_kernels::{AttentionRows, Backend, MatmulInput, MatmulProduct, StepKey};

use super::config::{Activation, ModelConfig};
use super::llama::{LlamaModel, LogitRows, Scratch, SequenceChunk};
use super::lora_rows::AdapterRuns;
use super::part::ModelPart;
use super::runs::{by_runs, runs, Gather, Run, Runs, SameTensor, Widths};
use super::weights::LayerWeights;
use super::ModelError;
use crate::adapter::{ResidentAdapter, Target};

/// One checkpoint alone: a step of one part.
impl<B: Backend> LlamaModel<B> {
    /// Runs one step over `chunks` and returns the requested logits, row after
    /// row in chunk order (`vocab_size` floats per row), held in `scratch`
    /// until its next step.
    pub fn forward<'s>(
        &self,
        backend: &B,
        kv: &mut B::KvStore,
        chunks: &mut [SequenceChunk<'_>],
        scratch: &'s mut Scratch<B>,
    ) -> Result<&'s [f32], ModelError> {
        self.forward_adapted(backend, kv, chunks, None, scratch)
    }

    /// [`LlamaModel::forward`] with `adapter`'s updates on every row.
    pub fn forward_adapted<'s>(
        &self,
        backend: &B,
        kv: &mut B::KvStore,
        chunks: &mut [SequenceChunk<'_>],
        adapter: Option<&ResidentAdapter<B>>,
        scratch: &'s mut Scratch<B>,
    ) -> Result<&'s [f32], ModelError> {
        let mut parts = [ModelPart {
            model: self,
            chunks,
            adapter,
        }];
        forward_many(backend, kv, &mut parts, scratch)
    }
}

/// Runs one step over every part's chunks (their tables' blocks in `kv`)
/// and returns the requested logits,
/// row after row in part then chunk order (`vocab_size` floats per row).
/// Every part must have the first part's configuration. The logits live in
/// `scratch` until its next step: a step allocates no output buffer (at
/// batch 16 they are 3 MB, and a fresh allocation each step cost page
/// faults on the serial path).
pub fn forward_many<'s, B: Backend>(
    backend: &B,
    kv: &mut B::KvStore,
    parts: &mut [ModelPart<'_, '_, B>],
    scratch: &'s mut Scratch<B>,
) -> Result<&'s [f32], ModelError> {
    forward_step(backend, kv, parts, scratch).map(|out| out.logits)
}

/// What one step returns, held in the scratch until its next step.
pub struct StepOutput<'s> {
    /// The requested logits, row after row in part then chunk order
    /// (`vocab_size` floats per row).
    pub logits: &'s [f32],
    /// For each [`LogitRows::Pooled`] chunk, in part then chunk order, the
    /// sum of its rows' final hidden states after the output norm
    /// (`hidden_size` floats each): what a mean-pooled embedding adds up.
    pub pooled: &'s [f32],
}

/// [`forward_many`], with the pooled hidden states of the chunks that ask
/// for them ([`LogitRows::Pooled`]): embeddings run in the same step as
/// generations.
pub fn forward_step<'s, B: Backend>(
    backend: &B,
    kv: &mut B::KvStore,
    parts: &mut [ModelPart<'_, '_, B>],
    scratch: &'s mut Scratch<B>,
) -> Result<StepOutput<'s>, ModelError> {
    let flat = checked(parts)?;
    let key = step_key(parts);
    let wanted = match run(backend, kv, parts, scratch, &flat, key) {
        Ok(wanted) => wanted,
        Err(e) => {
            backend.abort_step();
            if key.is_none() {
                return Err(e);
            }
            // A recorded step that failed launched nothing (or, eager,
            // wrote what this run writes again): run it unrecorded.
            tracing::debug!("a keyed step failed ({e}); running it again without its key");
            let again = run(backend, kv, parts, scratch, &flat, None);
            if again.is_err() {
                backend.abort_step();
            }
            again?
        }
    };
    Ok(output(backend, scratch, wanted))
}

/// The step's rows, once every part is known to have the first part's
/// configuration.
pub(super) fn checked<B: Backend>(parts: &[ModelPart<'_, '_, B>]) -> Result<Flat, ModelError> {
    let Some(lead) = parts.first().map(|p| p.model) else {
        return Err(ModelError::EmptyBatch);
    };
    let c = lead.config();
    if let Some(other) = parts.iter().find(|p| p.model.config() != c) {
        return Err(ModelError::MixedArchitectures {
            first: describe(c),
            other: describe(other.model.config()),
        });
    }
    flatten(lead, parts)
}

/// What a step that made `wanted` logit rows returns from `scratch`.
pub(super) fn output<'s, B: Backend>(
    backend: &B,
    scratch: &'s mut Scratch<B>,
    wanted: usize,
) -> StepOutput<'s> {
    let Scratch {
        logits,
        host_logits,
        pooled,
        ..
    } = scratch;
    let logits = if wanted == 0 {
        &[]
    } else {
        backend.host_rows(logits, host_logits)
    };
    StepOutput { logits, pooled }
}

/// Rows per sequence up to which a step is keyed (decode, a speculative
/// check): longer chunks are prompts, whose shapes rarely repeat.
const KEYED_ROWS: usize = 16;

/// The step's [`StepKey`]: equal for steps of checkpoints of the same
/// shapes ([`LlamaModel::shapes`]), without an adapter, with the same rows
/// per sequence and the same logits wanted, which make the same calls with
/// the same shapes; none for other steps. Checkpoints of one shape share
/// the key on purpose: a GPU backend replays one captured graph for each,
/// reading the step's weights through a table it swaps. The backend checks
/// the promise call by call.
fn step_key<B: Backend>(parts: &[ModelPart<'_, '_, B>]) -> Option<StepKey> {
    let [part] = parts else {
        return None;
    };
    if part.adapter.is_some() || part.chunks.iter().any(|c| c.tokens.len() > KEYED_ROWS) {
        return None;
    }
    let mut h = DefaultHasher::new();
    part.model.shapes().hash(&mut h);
    for c in part.chunks.iter() {
        let logits = match c.logits {
            LogitRows::None => 0u8,
            LogitRows::Last => 1,
            LogitRows::All => 2,
            // An embedding reads its hidden rows back mid-step.
            LogitRows::Pooled => return None,
        };
        (c.tokens.len(), logits).hash(&mut h);
    }
    Some(StepKey(h.finish()))
}

/// One run of the step (see [`forward_many`]): the step opened with `key`,
/// its operations, the step closed; returns how many logit rows it made.
fn run<B: Backend>(
    backend: &B,
    kv: &mut B::KvStore,
    parts: &mut [ModelPart<'_, '_, B>],
    s: &mut Scratch<B>,
    flat: &Flat,
    key: Option<StepKey>,
) -> Result<usize, ModelError> {
    open(backend, parts, s, flat, key)?;
    let layers = parts.first().map_or(0, |p| p.model.config().n_layers);
    for index in 0..layers {
        layer(backend, kv, parts, s, flat, index)?;
    }
    close(backend, parts, s, flat)
}

/// The start of a step: its buffers sized, the step opened with `key`, the
/// tokens' embeddings in `s.x`.
pub(super) fn open<B: Backend>(
    backend: &B,
    parts: &[ModelPart<'_, '_, B>],
    s: &mut Scratch<B>,
    flat: &Flat,
    key: Option<StepKey>,
) -> Result<(), ModelError> {
    let (tokens, _, part_rows) = flat;
    let Some(lead) = parts.first().map(|p| p.model) else {
        return Err(ModelError::EmptyBatch);
    };
    let c = lead.config();
    let n = tokens.len();
    let q_width = c.n_heads * c.head_dim;
    let kv_width = c.n_kv_heads * c.head_dim;

    backend.resize(&mut s.x, n, c.hidden_size);
    backend.resize(&mut s.normed, n, c.hidden_size);
    backend.resize(&mut s.q, n, q_width);
    backend.resize(&mut s.k, n, kv_width);
    backend.resize(&mut s.v, n, kv_width);
    backend.resize(&mut s.attn, n, q_width);
    backend.resize(&mut s.proj, n, c.hidden_size);
    backend.resize(&mut s.gate, n, c.intermediate_size);
    backend.resize(&mut s.up, n, c.intermediate_size);

    // Opened once the step's buffers have their sizes: a device backend
    // records the addresses it launches over.
    backend.begin_step(key);
    let embeds = runs(part_rows, parts.iter().map(|p| &**p.model.weights().embed));
    embed(backend, &embeds, tokens, c.hidden_size, s)?;
    if let Some(scale) = c.traits.embed_scale {
        backend.scale(&mut s.x, scale)?;
    }
    Ok(())
}

/// Layer `index` of a step over the rows in `s.x`.
pub(super) fn layer<B: Backend>(
    backend: &B,
    kv: &mut B::KvStore,
    parts: &mut [ModelPart<'_, '_, B>],
    s: &mut Scratch<B>,
    flat: &Flat,
    index: usize,
) -> Result<(), ModelError> {
    let (_, positions, part_rows) = flat;
    let Some(lead) = parts.first().map(|p| p.model) else {
        return Err(ModelError::EmptyBatch);
    };
    let adapters = AdapterRuns::of(parts, part_rows);
    let step = Step {
        backend,
        lead,
        part_rows,
        positions,
        adapters: &adapters,
    };
    // On the stack, as the lists below: the layer path allocates nothing
    // (its allocations were serial work between the step's pool jobs).
    let layers: SmallVec<[&LayerWeights<B>; 2]> = parts
        .iter()
        .filter_map(|p| p.model.weights().layers.get(index))
        .collect();
    if layers.len() != parts.len() {
        return Err(ModelError::MissingLayer { index });
    }
    step.attention_block(index, &layers, parts, kv, s)?;
    step.mlp_block(index, &layers, s)
}

/// The end of a step after its last layer: the pooled rows, the logits,
/// the step closed; returns how many logit rows it made.
pub(super) fn close<B: Backend>(
    backend: &B,
    parts: &[ModelPart<'_, '_, B>],
    s: &mut Scratch<B>,
    flat: &Flat,
) -> Result<usize, ModelError> {
    let (_, positions, part_rows) = flat;
    let Some(lead) = parts.first().map(|p| p.model) else {
        return Err(ModelError::EmptyBatch);
    };
    let adapters = AdapterRuns::of(parts, part_rows);
    let step = Step {
        backend,
        lead,
        part_rows,
        positions,
        adapters: &adapters,
    };
    step.pool(parts, s)?;
    let wanted = step.logits(parts, s)?;
    backend.end_step()?;
    Ok(wanted)
}

fn describe(c: &ModelConfig) -> String {
    format!(
        "{:?}, {} layers of width {}, vocabulary {}",
        c.architecture, c.n_layers, c.hidden_size, c.vocab_size
    )
}

/// Every part's tokens and positions, one after another, and each part's rows.
pub(super) type Flat = (Vec<u32>, Vec<u32>, Vec<Range<usize>>);

fn flatten<B: Backend>(
    lead: &LlamaModel<B>,
    parts: &[ModelPart<'_, '_, B>],
) -> Result<Flat, ModelError> {
    let c = lead.config();
    let mut tokens = Vec::new();
    let mut positions = Vec::new();
    let mut part_rows = Vec::with_capacity(parts.len());
    for part in parts {
        let first = tokens.len();
        for chunk in part.chunks.iter() {
            for (i, &token) in chunk.tokens.iter().enumerate() {
                if token as usize >= c.vocab_size {
                    return Err(ModelError::TokenOutOfRange {
                        token,
                        vocab_size: c.vocab_size,
                    });
                }
                let position = chunk.start_pos + i;
                if position >= c.context_length {
                    return Err(ModelError::ContextExceeded {
                        position,
                        context_length: c.context_length,
                    });
                }
                tokens.push(token);
                positions.push(position as u32);
            }
        }
        part_rows.push(first..tokens.len());
    }
    if tokens.is_empty() {
        return Err(ModelError::EmptyBatch);
    }
    Ok((tokens, positions, part_rows))
}

/// Looks up each run's token rows in its own embedding table.
fn embed<B: Backend>(
    backend: &B,
    tables: &[Run<&B::Matrix>],
    tokens: &[u32],
    hidden: usize,
    s: &mut Scratch<B>,
) -> Result<(), ModelError> {
    if let [only] = tables {
        return Ok(backend.embed(only.tensor, tokens, &mut s.x)?);
    }
    for run in tables {
        let len = run.rows.len();
        let ids = tokens.get(run.rows.clone()).unwrap_or_default();
        backend.resize(&mut s.gather.output, len, hidden);
        backend.embed(run.tensor, ids, &mut s.gather.output)?;
        backend.copy_rows(&s.gather.output, 0..len, &mut s.x, run.rows.start)?;
    }
    Ok(())
}

/// What every block of one step shares.
struct Step<'s, B: Backend> {
    backend: &'s B,
    /// The first part's model: the configuration every part has.
    lead: &'s LlamaModel<B>,
    part_rows: &'s [Range<usize>],
    positions: &'s [u32],
    /// The rows that take an adapter's updates.
    adapters: &'s AdapterRuns<'s, B>,
}

impl<B: Backend> Step<'_, B> {
    /// Adds the adapters' updates of `target` (layer `layer`) to their rows.
    fn lora(
        &self,
        layer: usize,
        target: Target,
        x: &B::Activations,
        out: &mut B::Activations,
    ) -> Result<(), ModelError> {
        self.adapters.apply(self.backend, layer, target, x, out)
    }

    fn runs<K: SameTensor>(&self, tensors: impl IntoIterator<Item = K>) -> Runs<K> {
        runs(self.part_rows, tensors)
    }

    /// `normed = rms_norm(x)` with each part's norm weights (`norms`).
    fn norm_hidden(&self, norms: &[Run<&B::Vector>], s: &mut Scratch<B>) -> Result<(), ModelError> {
        self.norm_rows(norms, &s.x, &mut s.normed, &mut s.gather)
    }

    fn norm_rows(
        &self,
        norms: &[Run<&B::Vector>],
        x: &B::Activations,
        normed: &mut B::Activations,
        gather: &mut Gather<B>,
    ) -> Result<(), ModelError> {
        let (b, c) = (self.backend, self.lead.config());
        let eps = c.rms_norm_eps;
        let same = Widths {
            input: c.hidden_size,
            output: c.hidden_size,
        };
        by_runs(b, norms, x, normed, same, gather, |x, w, out| {
            b.rms_norm(x, w, eps, out)
        })
    }

    /// The input of a matmul on `rms_norm(x)`: the norm itself when every
    /// part shares its weights (the backend fuses it into the matmul's
    /// job), else `normed`, normed here part by part.
    fn normed_input<'a>(
        &self,
        norms: &'a [Run<&B::Vector>],
        x: &'a B::Activations,
        normed: &'a mut B::Activations,
        gather: &mut Gather<B>,
    ) -> Result<MatmulInput<'a, B>, ModelError> {
        if let [norm] = norms {
            return Ok(MatmulInput::RmsNorm {
                x,
                weight: norm.tensor,
                eps: self.lead.config().rms_norm_eps,
                out: normed,
            });
        }
        self.norm_rows(norms, x, normed, gather)?;
        Ok(MatmulInput::Rows(normed))
    }

    fn attention_block(
        &self,
        index: usize,
        layers: &[&LayerWeights<B>],
        parts: &mut [ModelPart<'_, '_, B>],
        kv: &mut B::KvStore,
        s: &mut Scratch<B>,
    ) -> Result<(), ModelError> {
        let (b, c) = (self.backend, self.lead.config());
        let hidden = c.hidden_size;
        let q_width = c.n_heads * c.head_dim;
        let kv_width = c.n_kv_heads * c.head_dim;

        let norms = self.runs(layers.iter().map(|l| &**l.attn_norm));
        let matmul = |x: &B::Activations,
                      (w, bias): (&B::Matrix, Option<&B::Vector>),
                      out: &mut B::Activations| { b.matmul(x, w, bias, out) };
        let q = self.runs(layers.iter().map(|l| (&**l.wq, bias(l, 0))));
        let k = self.runs(layers.iter().map(|l| (&**l.wk, bias(l, 1))));
        let v = self.runs(layers.iter().map(|l| (&**l.wv, bias(l, 2))));
        let to = |output| Widths {
            input: hidden,
            output,
        };
        if let ([q], [k], [v]) = (q.as_slice(), k.as_slice(), v.as_slice()) {
            // Every part shares Q, K and V: the norm's rows are quantized
            // once for all three, in one job with the norm when that is
            // shared too.
            let product = |(w, bias), out| MatmulProduct {
                w,
                bias,
                out,
                accumulate: false,
            };
            let mut products = [
                product(q.tensor, &mut s.q),
                product(k.tensor, &mut s.k),
                product(v.tensor, &mut s.v),
            ];
            let input = self.normed_input(&norms, &s.x, &mut s.normed, &mut s.gather)?;
            b.matmul_many(input, &mut products)?;
        } else {
            self.norm_hidden(&norms, s)?;
            let g = &mut s.gather;
            by_runs(b, &q, &s.normed, &mut s.q, to(q_width), g, matmul)?;
            by_runs(b, &k, &s.normed, &mut s.k, to(kv_width), g, matmul)?;
            by_runs(b, &v, &s.normed, &mut s.v, to(kv_width), g, matmul)?;
        }
        // `normed` holds the norm's rows on both paths.
        self.adapters.apply_many(
            b,
            index,
            &s.normed,
            &mut [
                (Target::Q, &mut s.q),
                (Target::K, &mut s.k),
                (Target::V, &mut s.v),
            ],
        )?;
        if c.traits.qk_norm {
            let q_norms = self.runs(
                layers
                    .iter()
                    .filter_map(|l| l.qk_norm.as_ref().map(|n| &**n[0])),
            );
            let k_norms = self.runs(
                layers
                    .iter()
                    .filter_map(|l| l.qk_norm.as_ref().map(|n| &**n[1])),
            );
            self.norm_heads(&q_norms, &mut s.q, q_width, &mut s.gather)?;
            self.norm_heads(&k_norms, &mut s.k, kv_width, &mut s.gather)?;
        }
        let inv_freq = self.lead.inv_freq(index);
        b.rope(&mut s.q, c.head_dim, self.positions, inv_freq, c.rope_style)?;
        b.rope(&mut s.k, c.head_dim, self.positions, inv_freq, c.rope_style)?;
        let shape = self.lead.attention_shape(index);
        // Every sequence's attention in one call: one parallel job per layer
        // rather than one per sequence. (Filled in place: a collected
        // SmallVec is moved out, a `memcpy` call.)
        let mut row = 0;
        let mut seqs = SmallVec::<[AttentionRows<'_>; 4]>::new();
        seqs.extend(parts.iter().flat_map(|p| p.chunks.iter()).map(|chunk| {
            let rows = row..row + chunk.tokens.len();
            row = rows.end;
            AttentionRows {
                table: chunk.table,
                rows,
                start_pos: chunk.start_pos,
                prompt: chunk.prompt,
            }
        }));
        b.attention(index, shape, &s.q, &s.k, &s.v, kv, &seqs, &mut s.attn)?;
        drop(seqs);

        let wo = self.runs(layers.iter().map(|l| (&**l.wo, None::<&B::Vector>)));
        let post_norms = c.traits.post_norms;
        if let ([wo], false) = (wo.as_slice(), post_norms) {
            // The residual add rides on the product's job.
            let mut products = [MatmulProduct {
                w: wo.tensor.0,
                bias: None,
                out: &mut s.x,
                accumulate: true,
            }];
            b.matmul_many(MatmulInput::Rows(&s.attn), &mut products)?;
            return self.lora(index, Target::O, &s.attn, &mut s.x);
        }
        let from_heads = Widths {
            input: q_width,
            output: hidden,
        };
        by_runs(
            b,
            &wo,
            &s.attn,
            &mut s.proj,
            from_heads,
            &mut s.gather,
            matmul,
        )?;
        self.lora(index, Target::O, &s.attn, &mut s.proj)?;
        self.residual(layers, 0, s)
    }

    /// `x += proj`, through the layer's post norm (`which`: 0 after
    /// attention, 1 after the MLP) when the family has them.
    fn residual(
        &self,
        layers: &[&LayerWeights<B>],
        which: usize,
        s: &mut Scratch<B>,
    ) -> Result<(), ModelError> {
        let b = self.backend;
        if !self.lead.config().traits.post_norms {
            b.add(&mut s.x, &s.proj)?;
            return Ok(());
        }
        let norms = self.runs(
            layers
                .iter()
                .filter_map(|l| l.post_norms.as_ref().map(|n| &**n[which])),
        );
        if norms.is_empty() {
            return Err(ModelError::MissingLayer { index: which });
        }
        self.norm_rows(&norms, &s.proj, &mut s.normed, &mut s.gather)?;
        b.add(&mut s.x, &s.normed)?;
        Ok(())
    }

    /// RMS-normalizes each `head_dim`-wide head of `x` (`width` columns)
    /// in place with each part's weights (`norms`).
    fn norm_heads(
        &self,
        norms: &[Run<&B::Vector>],
        x: &mut B::Activations,
        width: usize,
        gather: &mut Gather<B>,
    ) -> Result<(), ModelError> {
        let (b, eps) = (self.backend, self.lead.config().rms_norm_eps);
        if let [only] = norms {
            return Ok(b.rms_norm_heads(x, only.tensor, eps)?);
        }
        for run in norms {
            let len = run.rows.len();
            b.resize(&mut gather.input, len, width);
            b.copy_rows(x, run.rows.clone(), &mut gather.input, 0)?;
            b.rms_norm_heads(&mut gather.input, run.tensor, eps)?;
            b.copy_rows(&gather.input, 0..len, x, run.rows.start)?;
        }
        Ok(())
    }

    fn mlp_block(
        &self,
        index: usize,
        layers: &[&LayerWeights<B>],
        s: &mut Scratch<B>,
    ) -> Result<(), ModelError> {
        let (b, c) = (self.backend, self.lead.config());
        let (hidden, inner) = (c.hidden_size, c.intermediate_size);
        let norms = self.runs(layers.iter().map(|l| &**l.ffn_norm));
        let matmul =
            |x: &B::Activations, w: &B::Matrix, out: &mut B::Activations| b.matmul(x, w, None, out);
        let up_widths = Widths {
            input: hidden,
            output: inner,
        };
        let gate = self.runs(layers.iter().map(|l| &**l.gate));
        let up = self.runs(layers.iter().map(|l| &**l.up));
        if let ([gate], [up]) = (gate.as_slice(), up.as_slice()) {
            // Every part shares both: the norm's rows are quantized once
            // for the two (as for Q, K and V above).
            let product = |w, out| MatmulProduct {
                w,
                bias: None,
                out,
                accumulate: false,
            };
            let mut products = [
                product(gate.tensor, &mut s.gate),
                product(up.tensor, &mut s.up),
            ];
            let input = self.normed_input(&norms, &s.x, &mut s.normed, &mut s.gather)?;
            b.matmul_many(input, &mut products)?;
        } else {
            self.norm_hidden(&norms, s)?;
            let g = &mut s.gather;
            by_runs(b, &gate, &s.normed, &mut s.gate, up_widths, g, matmul)?;
            by_runs(b, &up, &s.normed, &mut s.up, up_widths, g, matmul)?;
        }
        self.adapters.apply_many(
            b,
            index,
            &s.normed,
            &mut [(Target::Gate, &mut s.gate), (Target::Up, &mut s.up)],
        )?;
        let down = self.runs(layers.iter().map(|l| &**l.down));
        let post_norms = c.traits.post_norms;
        if let [down] = down.as_slice() {
            // The gating (and, without a post norm, the residual add) rides
            // on the product's job: each task gates and quantizes its own
            // rows.
            let (out, accumulate) = if post_norms {
                (&mut s.proj, false)
            } else {
                (&mut s.x, true)
            };
            let mut products = [MatmulProduct {
                w: down.tensor,
                bias: None,
                out,
                accumulate,
            }];
            let input = match c.traits.activation {
                Activation::Silu => MatmulInput::SiluMul {
                    gate: &mut s.gate,
                    up: &s.up,
                },
                Activation::GeluTanh => MatmulInput::GeluMul {
                    gate: &mut s.gate,
                    up: &s.up,
                },
            };
            b.matmul_many(input, &mut products)?;
            // The gating ran in place: `gate` holds the down product's input.
            if !post_norms {
                return self.lora(index, Target::Down, &s.gate, &mut s.x);
            }
            self.lora(index, Target::Down, &s.gate, &mut s.proj)?;
            return self.residual(layers, 1, s);
        }
        match c.traits.activation {
            Activation::Silu => b.silu_mul(&mut s.gate, &s.up)?,
            Activation::GeluTanh => b.gelu_mul(&mut s.gate, &s.up)?,
        }
        let down_widths = Widths {
            input: inner,
            output: hidden,
        };
        by_runs(
            b,
            &down,
            &s.gate,
            &mut s.proj,
            down_widths,
            &mut s.gather,
            matmul,
        )?;
        self.lora(index, Target::Down, &s.gate, &mut s.proj)?;
        self.residual(layers, 1, s)
    }

    /// Final norm and output projection, on the rows that want logits only
    /// (the output projection is the largest matrix of a small model),
    /// into `s.logits`: how many rows.
    fn logits(
        &self,
        parts: &[ModelPart<'_, '_, B>],
        s: &mut Scratch<B>,
    ) -> Result<usize, ModelError> {
        let (b, c) = (self.backend, self.lead.config());
        let hidden = c.hidden_size;
        // The rows that want logits, and each part's share of them.
        let mut wanted = Vec::new();
        let mut wanted_rows = Vec::with_capacity(parts.len());
        let mut row = 0;
        for part in parts {
            let first = wanted.len();
            for chunk in part.chunks.iter() {
                let len = chunk.tokens.len();
                match chunk.logits {
                    LogitRows::None | LogitRows::Pooled => {}
                    LogitRows::Last => wanted.push(row + len - 1),
                    LogitRows::All => wanted.extend(row..row + len),
                }
                row += len;
            }
            wanted_rows.push(first..wanted.len());
        }
        if wanted.is_empty() {
            return Ok(0);
        }
        select_rows(b, &s.x, &wanted, hidden, &mut s.selected)?;
        let norms = runs(
            &wanted_rows,
            parts.iter().map(|p| &**p.model.weights().output_norm),
        );
        let same = Widths {
            input: hidden,
            output: hidden,
        };
        let eps = c.rms_norm_eps;
        b.resize(&mut s.normed, wanted.len(), hidden);
        by_runs(
            b,
            &norms,
            &s.selected,
            &mut s.normed,
            same,
            &mut s.gather,
            |x, w, out| b.rms_norm(x, w, eps, out),
        )?;
        let heads = runs(
            &wanted_rows,
            parts.iter().map(|p| p.model.weights().lm_head()),
        );
        let to_vocab = Widths {
            input: hidden,
            output: c.vocab_size,
        };
        b.resize(&mut s.logits, wanted.len(), c.vocab_size);
        by_runs(
            b,
            &heads,
            &s.normed,
            &mut s.logits,
            to_vocab,
            &mut s.gather,
            |x, w, out| b.matmul(x, w, None, out),
        )?;
        if let Some(cap) = c.traits.final_softcap {
            b.softcap(&mut s.logits, cap)?;
        }
        Ok(wanted.len())
    }

    /// Into `s.pooled`: for each [`LogitRows::Pooled`] chunk, the sum of its
    /// rows' hidden states after each part's output norm (the state the
    /// output projection would read; llama.cpp pools the same one). Summed
    /// on the host in f64: a chunk holds up to a step's rows.
    fn pool(&self, parts: &[ModelPart<'_, '_, B>], s: &mut Scratch<B>) -> Result<(), ModelError> {
        let (b, c) = (self.backend, self.lead.config());
        let hidden = c.hidden_size;
        s.pooled.clear();
        // The pooled rows, each chunk's share of them, and each part's.
        let mut wanted = Vec::new();
        let mut chunk_rows = Vec::new();
        let mut part_rows = Vec::with_capacity(parts.len());
        let mut row = 0;
        for part in parts {
            let first = wanted.len();
            for chunk in part.chunks.iter() {
                let len = chunk.tokens.len();
                if chunk.logits == LogitRows::Pooled {
                    chunk_rows.push(wanted.len()..wanted.len() + len);
                    wanted.extend(row..row + len);
                }
                row += len;
            }
            part_rows.push(first..wanted.len());
        }
        if wanted.is_empty() {
            return Ok(());
        }
        select_rows(b, &s.x, &wanted, hidden, &mut s.selected)?;
        let norms = runs(
            &part_rows,
            parts.iter().map(|p| &**p.model.weights().output_norm),
        );
        let same = Widths {
            input: hidden,
            output: hidden,
        };
        let eps = c.rms_norm_eps;
        b.resize(&mut s.hidden, wanted.len(), hidden);
        by_runs(
            b,
            &norms,
            &s.selected,
            &mut s.hidden,
            same,
            &mut s.gather,
            |x, w, out| b.rms_norm(x, w, eps, out),
        )?;
        let rows = b.host_rows(&s.hidden, &mut s.host_hidden);
        for chunk in chunk_rows {
            let mut sum = vec![0f64; hidden];
            for r in chunk {
                let values = rows.get(r * hidden..(r + 1) * hidden).unwrap_or_default();
                for (total, &value) in sum.iter_mut().zip(values) {
                    *total += f64::from(value);
                }
            }
            s.pooled.extend(sum.iter().map(|&total| total as f32));
        }
        Ok(())
    }
}

/// Layer `l`'s Q (0), K (1) or V (2) bias, if it has them.
fn bias<B: Backend>(l: &LayerWeights<B>, which: usize) -> Option<&B::Vector> {
    let biases = l.qkv_bias.as_ref()?;
    biases.get(which).map(|v| &***v)
}

/// Copies rows `wanted` of `x` into `selected`, in order.
fn select_rows<B: Backend>(
    b: &B,
    x: &B::Activations,
    wanted: &[usize],
    cols: usize,
    selected: &mut B::Activations,
) -> Result<(), ModelError> {
    b.resize(selected, wanted.len(), cols);
    for (i, &row) in wanted.iter().enumerate() {
        b.copy_rows(x, row..row + 1, selected, i)?;
    }
    Ok(())
}
