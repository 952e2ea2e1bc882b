//! LoRA adapters on a synthetic base: both file forms load to the same
//! update in the base's row order, the update is the one a Hugging Face
//! base gets (so the Q/K permutation for a GGUF base is right), a batch
//! mixing the base and several adapters gives each row exactly its own
//! logits, and bad adapters are refused with a message naming the file.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_engine::adapter::{
    load_adapter, AdapterError, LoraSet, ResidentAdapter, Target, TARGETS,
};
use switchyard_engine::formats::{load_checkpoint, Checkpoint, CheckpointFormat};
use switchyard_engine::kv::{KvBlocks, KvPool, SequenceKv};
use switchyard_engine::model::{forward_many, LlamaModel, LogitRows, ModelPart, SequenceChunk};
use switchyard_engine::synthetic::{write_gguf, write_safetensors, Preset, SyntheticSpec};
use switchyard_kernels::{on_each_device, Backend, DType, KvPrefix};
use tempfile::TempDir;

/// The same F32 model as a GGUF file (Q/K rows permuted, interleaved
/// RoPE) and as a Hugging Face folder (halves, NeoX RoPE).
fn bases(dir: &Path, preset: Preset) -> (Checkpoint, Checkpoint) {
    let spec = SyntheticSpec {
        preset,
        dtype: DType::F32,
        seed: 11,
    };
    let gguf = dir.join(format!("{}.gguf", preset.name()));
    write_gguf(&spec, &gguf).unwrap();
    let hf = dir.join(format!("{}-hf", preset.name()));
    write_safetensors(&spec, &hf, 1).unwrap();
    (
        load_checkpoint(&gguf).unwrap(),
        load_checkpoint(&hf).unwrap(),
    )
}

fn adapter_set(config: &switchyard_engine::model::config::ModelConfig, seed: u64) -> LoraSet {
    LoraSet::random(config, 4, &TARGETS, seed, 0.05)
}

const PROMPT: &[u32] = &[1, 5, 9, 2, 44, 17, 3];

/// A KV pool without a budget, F16 as the executor's default.
fn unlimited_kv<B: Backend>(backend: &B) -> Arc<KvBlocks<B>> {
    KvBlocks::new(backend, &KvPool::unlimited(switchyard_kernels::KvType::F16)).unwrap()
}

const DECODE: [u32; 4] = [3, 8, 8, 40];

/// Logits of every position of `PROMPT`, then of 4 decode steps of
/// fixed tokens, for `model` with `adapter`, alone.
fn logits<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    adapter: Option<&ResidentAdapter<B>>,
) -> Vec<Vec<f32>> {
    let blocks = unlimited_kv(backend);
    let mut cache = SequenceKv::for_model(backend, &blocks, model, 64, KvPrefix::none()).unwrap();
    let mut scratch = model.new_scratch(backend);
    let vocab = model.config().vocab_size;
    let mut chunks = [SequenceChunk {
        tokens: PROMPT,
        start_pos: 0,
        table: cache.prepare(backend, 0..PROMPT.len()).unwrap(),
        logits: LogitRows::All,
        prompt: true,
    }];
    let out = model
        .forward_adapted(
            backend,
            &mut blocks.lock(),
            &mut chunks,
            adapter,
            &mut scratch,
        )
        .unwrap();
    let mut rows: Vec<Vec<f32>> = out.chunks(vocab).map(<[f32]>::to_vec).collect();
    for (i, token) in DECODE.iter().enumerate() {
        let at = PROMPT.len() + i;
        let mut chunks = [SequenceChunk {
            tokens: std::slice::from_ref(token),
            start_pos: at,
            table: cache.prepare(backend, at..at + 1).unwrap(),
            logits: LogitRows::Last,
            prompt: false,
        }];
        let out = model
            .forward_adapted(
                backend,
                &mut blocks.lock(),
                &mut chunks,
                adapter,
                &mut scratch,
            )
            .unwrap();
        rows.push(out.to_vec());
    }
    rows
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn peft(dir: &Path, name: &str, set: &LoraSet, dtype: DType) -> PathBuf {
    let path = dir.join(name);
    set.write_peft(&path, dtype).unwrap();
    path
}

/// The GGUF and Hugging Face forms of one F32 model agree to float
/// rounding of differently ordered sums: logits of this model span about
/// ±10, and the two forms differ by under 1e-4 without an adapter.
const FORMS_ATOL: f32 = 2e-3;

fn peft_and_gguf_forms_give_the_update_a_hugging_face_base_gets<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let backend = &*backend;
    for preset in [Preset::Smollm2, Preset::Qwen2] {
        let (gguf_base, hf_base) = bases(dir.path(), preset);
        assert_eq!(gguf_base.format, CheckpointFormat::Gguf);
        let set = adapter_set(&gguf_base.config, 3);
        let peft_dir = peft(
            dir.path(),
            &format!("{}-peft", preset.name()),
            &set,
            DType::F32,
        );
        let gguf_file = dir.path().join(format!("{}-lora.gguf", preset.name()));
        set.write_gguf(&gguf_file, &gguf_base.config, DType::F32)
            .unwrap();

        let g_model = LlamaModel::load(backend, &gguf_base).unwrap();
        let h_model = LlamaModel::load(backend, &hf_base).unwrap();
        let up = |path: &Path, base: &Checkpoint| {
            let w = load_adapter(path, base).unwrap();
            ResidentAdapter::upload(backend, &w).unwrap()
        };
        // The reference: a PEFT adapter on the Hugging Face base (no
        // reordering anywhere).
        let want = logits(backend, &h_model, Some(&up(&peft_dir, &hf_base)));
        let plain = logits(backend, &h_model, None);
        assert!(
            max_diff(&want, &plain) > 0.05,
            "{preset:?}: the adapter changes nothing"
        );
        for (what, model, adapter) in [
            ("PEFT on GGUF", &g_model, up(&peft_dir, &gguf_base)),
            ("GGUF on GGUF", &g_model, up(&gguf_file, &gguf_base)),
            ("GGUF on HF", &h_model, up(&gguf_file, &hf_base)),
        ] {
            let got = logits(backend, model, Some(&adapter));
            let diff = max_diff(&got, &want);
            println!("{preset:?} {what}: max |Δ| {diff:e}");
            assert!(diff < FORMS_ATOL, "{preset:?} {what}: {diff}");
        }
        // The two file forms load to the very same update.
        let from_peft = load_adapter(&peft_dir, &gguf_base).unwrap();
        let from_gguf = load_adapter(&gguf_file, &gguf_base).unwrap();
        assert_eq!(from_peft.layers, from_gguf.layers, "{preset:?}");
        assert_eq!(from_peft.identity, from_gguf.identity);
    }
}

on_each_device!(
    peft_and_gguf_forms_give_the_update_a_hugging_face_base_gets,
    cpu_only = "LoRA: no CUDA kernel yet"
);

#[test]
fn every_tensor_type_loads_within_its_rounding() {
    let dir = TempDir::new().unwrap();
    let (base, _) = bases(dir.path(), Preset::Smollm2);
    let set = LoraSet::random(&base.config, 32, &[Target::Q, Target::Down], 5, 0.05);
    let exact = load_adapter(&peft(dir.path(), "f32", &set, DType::F32), &base).unwrap();
    // Relative rounding of each type (of values up to 0.05): F16 11
    // bits, BF16 8 bits, Q8_0 a 1/127 step of its block's largest value.
    for (dtype, atol) in [
        (DType::F16, 0.05 / 1024.0),
        (DType::BF16, 0.05 / 128.0),
        (DType::Q8_0, 0.05 / 127.0),
    ] {
        let loaded = if dtype == DType::Q8_0 {
            let path = dir.path().join("q8.gguf");
            set.write_gguf(&path, &base.config, dtype).unwrap();
            load_adapter(&path, &base).unwrap()
        } else {
            load_adapter(&peft(dir.path(), &dtype.to_string(), &set, dtype), &base).unwrap()
        };
        for ((_, _, w), (_, _, e)) in loaded.weights().zip(exact.weights()) {
            assert_eq!(w.scale, e.scale);
            for (x, y) in w.a.iter().chain(&w.b_t).zip(e.a.iter().chain(&e.b_t)) {
                assert!((x - y).abs() <= atol, "{dtype}: {x} vs {y}");
            }
        }
    }
}

fn a_mixed_batch_gives_every_row_its_logits_alone<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let backend = &*backend;
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q4_1,
        seed: 2,
    };
    let path = dir.path().join("base.gguf");
    write_gguf(&spec, &path).unwrap();
    let base = load_checkpoint(&path).unwrap();
    let model = LlamaModel::load(backend, &base).unwrap();
    let adapters: Vec<ResidentAdapter<B>> = (0..3)
        .map(|i| {
            let set = LoraSet::random(&base.config, 2 + 2 * i, &TARGETS[i..], 10 + i as u64, 0.05);
            let p = peft(dir.path(), &format!("a{i}"), &set, DType::F32);
            ResidentAdapter::upload(backend, &load_adapter(&p, &base).unwrap()).unwrap()
        })
        .collect();
    // Rows: base, adapter 0, adapter 1, base, adapter 0, adapter 2.
    let which: [Option<usize>; 6] = [None, Some(0), Some(1), None, Some(0), Some(2)];
    let alone: Vec<Vec<Vec<f32>>> = which
        .iter()
        .map(|w| logits(backend, &model, w.map(|i| &adapters[i])))
        .collect();
    for w in 0..3 {
        assert!(max_diff(&alone[1 + w.min(1)], &alone[0]) > 0.0);
    }

    // One part per sequence, all on the one model: the base's products
    // run once over every row, each adapter's update on its part's rows.
    let blocks = unlimited_kv(backend);
    let mut caches: Vec<_> = which
        .iter()
        .map(|_| SequenceKv::for_model(backend, &blocks, &model, 64, KvPrefix::none()).unwrap())
        .collect();
    let mut scratch = model.new_scratch(backend);
    let vocab = model.config().vocab_size;
    let mut mixed: Vec<Vec<Vec<f32>>> = vec![Vec::new(); which.len()];
    for step in 0..=DECODE.len() {
        let (tokens, at, rows) = match step {
            0 => (PROMPT, 0, LogitRows::All),
            s => (
                std::slice::from_ref(&DECODE[s - 1]),
                PROMPT.len() + s - 1,
                LogitRows::Last,
            ),
        };
        let mut chunks: Vec<SequenceChunk<'_>> = caches
            .iter_mut()
            .map(|cache| SequenceChunk {
                tokens,
                start_pos: at,
                table: cache.prepare(backend, at..at + tokens.len()).unwrap(),
                logits: rows,
                prompt: step == 0,
            })
            .collect();
        let mut parts: Vec<ModelPart<'_, '_, B>> = chunks
            .chunks_mut(1)
            .zip(&which)
            .map(|(chunks, w)| ModelPart {
                model: &model,
                chunks,
                adapter: w.map(|i| &adapters[i]),
            })
            .collect();
        let out = forward_many(backend, &mut blocks.lock(), &mut parts, &mut scratch).unwrap();
        let per = out.len() / which.len();
        for (i, rows) in out.chunks(per).enumerate() {
            mixed[i].extend(rows.chunks(vocab).map(<[f32]>::to_vec));
        }
    }
    for (i, (m, a)) in mixed.iter().zip(&alone).enumerate() {
        assert_eq!(m, a, "row {i} ({:?}) differs from its run alone", which[i]);
    }
}

on_each_device!(
    a_mixed_batch_gives_every_row_its_logits_alone,
    cpu_only = "LoRA: no CUDA kernel yet"
);

fn a_zero_update_leaves_the_base_bit_for_bit<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let backend = &*backend;
    let (base, _) = bases(dir.path(), Preset::Smollm2);
    let mut set = adapter_set(&base.config, 1);
    set.pairs.iter_mut().for_each(|p| p.b.fill(0.0));
    let w = load_adapter(&peft(dir.path(), "zero", &set, DType::F32), &base).unwrap();
    let model = LlamaModel::load(backend, &base).unwrap();
    let adapter = ResidentAdapter::upload(backend, &w).unwrap();
    assert_eq!(
        logits(backend, &model, Some(&adapter)),
        logits(backend, &model, None)
    );
    // Resident in BF16: half the f32 bytes the loader holds.
    assert_eq!(adapter.bytes() * 2, w.bytes());
}

on_each_device!(
    a_zero_update_leaves_the_base_bit_for_bit,
    threads = 1,
    cpu_only = "LoRA: no CUDA kernel yet"
);

fn refusal(path: &Path, base: &Checkpoint) -> String {
    let err: AdapterError = load_adapter(path, base).unwrap_err();
    err.to_string()
}

#[test]
fn bad_adapters_are_refused_naming_file_and_tensor() {
    let dir = TempDir::new().unwrap();
    let d = dir.path();
    let (base, _) = bases(d, Preset::Smollm2);
    let (other, _) = bases(d, Preset::Llama);
    let set = adapter_set(&base.config, 4);

    // Made for another base: shapes differ.
    let foreign = peft(d, "foreign", &adapter_set(&other.config, 4), DType::F32);
    let msg = refusal(&foreign, &base);
    assert!(
        msg.contains("adapter_model.safetensors") && msg.contains("shape"),
        "{msg}"
    );
    assert!(msg.contains("lora_A") || msg.contains("lora_B"), "{msg}");

    // A GGUF adapter of another architecture.
    let mut qwen_config = base.config.clone();
    qwen_config.architecture = switchyard_engine::model::config::Architecture::Qwen2;
    let qwen = d.join("qwen.gguf");
    set.write_gguf(&qwen, &qwen_config, DType::F32).unwrap();
    let msg = refusal(&qwen, &base);
    assert!(msg.contains("qwen2") && msg.contains("qwen.gguf"), "{msg}");

    // Truncated.
    let good = d.join("good.gguf");
    set.write_gguf(&good, &base.config, DType::F32).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let cut = d.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let msg = refusal(&cut, &base);
    assert!(msg.contains("cut.gguf"), "{msg}");
    let cut_peft = peft(d, "cut-peft", &set, DType::F32);
    let st = cut_peft.join("adapter_model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() - 100]).unwrap();
    let msg = refusal(&cut_peft, &base);
    assert!(msg.contains("adapter_model.safetensors"), "{msg}");

    // Rank 0 in the config.
    let zero = peft(d, "rank0", &set, DType::F32);
    let cfg = zero.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"r\": 4", "\"r\": 0");
    std::fs::write(&cfg, text).unwrap();
    let msg = refusal(&zero, &base);
    assert!(msg.contains("rank 0"), "{msg}");

    // An unknown target.
    let unknown = peft(d, "unknown", &set, DType::F32);
    let cfg = unknown.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"down_proj\"", "\"lm_head\"");
    std::fs::write(&cfg, text).unwrap();
    let msg = refusal(&unknown, &base);
    assert!(
        msg.contains("lm_head") && msg.contains("adapter_config.json"),
        "{msg}"
    );

    // The base model itself is not an adapter.
    let msg = refusal(&base.source, &base);
    assert!(msg.contains("not a LoRA adapter"), "{msg}");
    // A folder without adapter_config.json.
    let msg = refusal(d, &base);
    assert!(msg.contains("not a LoRA adapter"), "{msg}");
}
