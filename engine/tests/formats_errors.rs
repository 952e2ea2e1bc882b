//! Bad checkpoints give clear errors naming the file and the reason, and
//! never panic.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use switchyard_engine::formats::gguf::{GgufFile, GgufWriter, MetaValue};
use switchyard_engine::formats::{load_checkpoint, FormatError};
use switchyard_engine::synthetic::{write_gguf, write_safetensors, Preset, SyntheticSpec};
use switchyard_kernels::DType;

fn spec(preset: Preset, dtype: DType) -> SyntheticSpec {
    SyntheticSpec {
        preset,
        dtype,
        seed: 1,
    }
}

/// Loads `path`, expecting an error whose message names the path and
/// contains every one of `words`.
fn expect_error(path: &Path, words: &[&str]) -> FormatError {
    let err = match load_checkpoint(path) {
        Ok(_) => panic!("{} loaded but should not have", path.display()),
        Err(e) => e,
    };
    let msg = err.to_string();
    println!("{msg}");
    assert!(
        msg.contains(&path.display().to_string()),
        "no path in: {msg}"
    );
    for w in words {
        assert!(msg.contains(w), "'{w}' missing from: {msg}");
    }
    err
}

// --- a hand-rolled GGUF image, independent of our writer -----------------

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct RawTensor<'a> {
    name: &'a str,
    dims: &'a [u64],
    type_id: u32,
    offset: u64,
}

/// A GGUF image: one string metadata entry, the given tensors, then
/// `data_len` bytes of data after 32-byte alignment.
fn raw_gguf(version: u32, tensors: &[RawTensor<'_>], data_len: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    put_str(&mut out, "general.architecture");
    out.extend_from_slice(&8u32.to_le_bytes());
    put_str(&mut out, "llama");
    for t in tensors {
        put_str(&mut out, t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        t.dims
            .iter()
            .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.extend_from_slice(&t.type_id.to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    out.resize(out.len().next_multiple_of(32) + data_len, 0);
    out
}

fn f32_tensor(name: &str, offset: u64) -> RawTensor<'_> {
    RawTensor {
        name,
        dims: &[8],
        type_id: 0,
        offset,
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn truncated_files_are_reported_at_every_cut() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.gguf");
    write_gguf(&spec(Preset::Qwen2, DType::Q4K), &full).unwrap();
    let bytes = std::fs::read(&full).unwrap();
    // Past the header, cut every few KiB; within it, at every 7th byte.
    let header_len = 16_000.min(bytes.len());
    let cuts = (0..header_len)
        .step_by(7)
        .chain((header_len..bytes.len() - 32).step_by(4099));
    for cut in cuts {
        let path = write(dir.path(), "cut.gguf", &bytes[..cut]);
        let err = load_checkpoint(&path).expect_err(&format!("cut at {cut} loaded"));
        let msg = err.to_string();
        assert!(msg.contains("cut.gguf"), "cut {cut}: {msg}");
        assert!(
            matches!(
                err,
                FormatError::Truncated { .. }
                    | FormatError::TensorOutOfBounds { .. }
                    | FormatError::NotACheckpoint { .. }
            ),
            "cut {cut}: {msg}"
        );
    }
}

#[test]
fn wrong_magic_and_versions_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = raw_gguf(3, &[f32_tensor("x", 0)], 32);
    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GGML");
    expect_error(&write(dir.path(), "magic.bin", &bad), &["GGUF"]);
    expect_error(&write(dir.path(), "empty.gguf", b""), &["GGUF"]);
    for version in [1u32, 4, 0x0300_0000] {
        let bytes = raw_gguf(version, &[f32_tensor("x", 0)], 32);
        let path = write(dir.path(), "version.gguf", &bytes);
        let err = expect_error(&path, &[]);
        let msg = err.to_string();
        if version == 0x0300_0000 {
            assert!(msg.contains("big-endian"), "{msg}");
        } else {
            assert!(msg.contains(&format!("version {version}")), "{msg}");
            assert!(msg.contains("v2 and v3"), "{msg}");
        }
    }
    // A version-2 image of the same header parses.
    GgufFile::parse(&raw_gguf(2, &[f32_tensor("x", 0)], 32)).unwrap();
    GgufFile::parse(&good).unwrap();
}

#[test]
fn bad_tensor_descriptions_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<u8>, &[&str])> = vec![
        (
            raw_gguf(3, &[f32_tensor("far", 64)], 32),
            &["far", "past the end"],
        ),
        (
            raw_gguf(3, &[f32_tensor("huge", u64::MAX - 31)], 32),
            &["huge", "beyond any possible file"],
        ),
        (
            raw_gguf(
                3,
                &[RawTensor {
                    name: "iq2",
                    dims: &[256],
                    type_id: 16,
                    offset: 0,
                }],
                32,
            ),
            &["iq2", "IQ2_XXS", "id 16", "re-quantize"],
        ),
        (
            raw_gguf(3, &[f32_tensor("twice", 0), f32_tensor("twice", 32)], 64),
            &["twice", "twice"],
        ),
        (
            raw_gguf(3, &[f32_tensor("odd", 4)], 64),
            &["odd", "alignment"],
        ),
        (
            raw_gguf(
                3,
                &[RawTensor {
                    name: "five",
                    dims: &[1, 1, 1, 1, 1],
                    type_id: 0,
                    offset: 0,
                }],
                32,
            ),
            &["five", "5 dimensions"],
        ),
        (
            raw_gguf(
                3,
                &[RawTensor {
                    name: "ragged",
                    dims: &[33, 2],
                    type_id: 8,
                    offset: 0,
                }],
                128,
            ),
            &["ragged", "q8_0"],
        ),
        (
            raw_gguf(
                3,
                &[RawTensor {
                    name: "overflow",
                    dims: &[1 << 40, 1 << 40],
                    type_id: 0,
                    offset: 0,
                }],
                32,
            ),
            &["overflow"],
        ),
    ];
    for (i, (bytes, words)) in cases.iter().enumerate() {
        let path = write(dir.path(), &format!("case{i}.gguf"), bytes);
        expect_error(&path, words);
    }
}

#[test]
fn hostile_counts_fail_before_allocating() {
    // A header claiming 2^60 metadata entries, or an array of 2^60 strings,
    // in a tiny file: rejected as truncated without trying to allocate.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let err = GgufFile::parse(&bytes).unwrap_err();
    assert!(matches!(err, FormatError::Truncated { .. }), "{err}");

    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    put_str(&mut bytes, "tokenizer.ggml.tokens");
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
    bytes.extend_from_slice(&[0; 64]);
    let err = GgufFile::parse(&bytes).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");

    // Arrays nested a thousand deep are refused, not recursed into.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    put_str(&mut bytes, "deep");
    bytes.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..1000 {
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
    }
    let err = GgufFile::parse(&bytes).unwrap_err();
    assert!(err.to_string().contains("deep"), "{err}");
}

/// Rewrites a GGUF file through our writer, letting `edit` change metadata
/// and dropping the tensors `drop` names.
fn rewrite(src: &Path, dst: &Path, edit: impl Fn(&mut Vec<(String, MetaValue)>), drop: &[&str]) {
    let file = GgufFile::open(src).unwrap();
    let mut entries: Vec<(String, MetaValue)> = file
        .metadata()
        .entries
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    edit(&mut entries);
    let mut w = GgufWriter::new(dst);
    for (k, v) in entries {
        w.add_metadata(k, v);
    }
    for (name, info) in file.tensors() {
        if !drop.contains(&name.as_str()) {
            let t = file.tensor_data(name).unwrap();
            w.add_tensor(name.clone(), info.dtype, &info.shape, t.data)
                .unwrap();
        }
    }
    w.write().unwrap();
}

#[test]
fn gguf_contradictions_and_missing_parts_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.gguf");
    write_gguf(&spec(Preset::Llama, DType::Q8_0), &src).unwrap();

    let ffn = dir.path().join("ffn.gguf");
    rewrite(
        &src,
        &ffn,
        |m| {
            m.retain(|(k, _)| k != "llama.feed_forward_length");
            m.push(("llama.feed_forward_length".into(), MetaValue::U32(1024)));
        },
        &[],
    );
    expect_error(
        &ffn,
        &["blk.0.ffn_gate.weight", "[1024, 256]", "[512, 256]"],
    );

    let no_tok = dir.path().join("no-tokenizer.gguf");
    rewrite(
        &src,
        &no_tok,
        |m| m.retain(|(k, _)| k != "tokenizer.ggml.model"),
        &[],
    );
    expect_error(&no_tok, &["tokenizer", "tokenizer.ggml.model"]);

    let no_tensor = dir.path().join("no-ffn-up.gguf");
    rewrite(&src, &no_tensor, |_| {}, &["blk.1.ffn_up.weight"]);
    expect_error(&no_tensor, &["blk.1.ffn_up.weight"]);

    let arch = dir.path().join("arch.gguf");
    rewrite(
        &src,
        &arch,
        |m| {
            m.retain(|(k, _)| k != "general.architecture");
            m.push((
                "general.architecture".into(),
                MetaValue::String("gpt2".into()),
            ));
        },
        &[],
    );
    expect_error(
        &arch,
        &[
            "gpt2",
            "qwen3, gemma2, gemma3 (text) and phi3",
            "convert the model",
        ],
    );

    let heads = dir.path().join("heads.gguf");
    rewrite(
        &src,
        &heads,
        |m| {
            m.retain(|(k, _)| k != "llama.attention.head_count_kv");
            m.push(("llama.attention.head_count_kv".into(), MetaValue::U32(3)));
        },
        &[],
    );
    expect_error(&heads, &["n_kv_heads"]);

    let no_key = dir.path().join("no-key.gguf");
    rewrite(
        &src,
        &no_key,
        |m| m.retain(|(k, _)| k != "llama.block_count"),
        &[],
    );
    expect_error(&no_key, &["llama.block_count", "missing"]);

    let layers = dir.path().join("layers.gguf");
    rewrite(
        &src,
        &layers,
        |m| {
            m.retain(|(k, _)| k != "llama.block_count");
            m.push(("llama.block_count".into(), MetaValue::U64(u64::MAX / 2)));
        },
        &[],
    );
    expect_error(&layers, &["blk.2.attn_norm.weight"]);
}

#[test]
fn hf_folder_problems_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str| {
        let folder = dir.path().join(name);
        write_safetensors(&spec(Preset::Mistral, DType::BF16), &folder, 2).unwrap();
        folder
    };

    let f = make("no-tokenizer");
    std::fs::remove_file(f.join("tokenizer.json")).unwrap();
    expect_error(&f, &["tokenizer.json"]);

    let f = make("no-config");
    std::fs::remove_file(f.join("config.json")).unwrap();
    expect_error(&f, &["config.json"]);

    let f = make("bad-json");
    std::fs::write(f.join("config.json"), "{\"model_type\": \"mistral\",").unwrap();
    let err = expect_error(&f, &["config.json", "not valid JSON"]);
    assert!(matches!(err, FormatError::Json { .. }));

    let f = make("shape");
    let text = std::fs::read_to_string(f.join("config.json")).unwrap();
    let text = text.replace("\"hidden_size\": 256", "\"hidden_size\": 128");
    std::fs::write(f.join("config.json"), text).unwrap();
    expect_error(&f, &["token_embd.weight", "[320, 128]", "[320, 256]"]);

    let f = make("no-shard");
    std::fs::remove_file(f.join("model-00002-of-00002.safetensors")).unwrap();
    expect_error(&f, &["model-00002-of-00002.safetensors"]);

    let f = make("no-weights");
    std::fs::remove_file(f.join("model.safetensors.index.json")).unwrap();
    expect_error(&f, &["model.safetensors"]);

    let f = make("corrupt-shard");
    std::fs::write(
        f.join("model-00001-of-00002.safetensors"),
        b"\x08\0\0\0\0\0\0\0{}",
    )
    .unwrap();
    expect_error(&f, &["model-00001-of-00002.safetensors", "safetensors"]);

    let f = make("int-weights");
    let shard = f.join("model-00001-of-00002.safetensors");
    let data = [0u8; 16];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![4], &data).unwrap();
    safetensors::serialize_to_file([("model.norm.weight", view)], None, &shard).unwrap();
    expect_error(&f, &["model.norm.weight", "I32"]);

    let missing = dir.path().join("does-not-exist");
    expect_error(&missing, &["cannot read"]);
}

#[test]
fn random_corruption_never_panics() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.gguf");
    write_gguf(&spec(Preset::Tinyllama, DType::Q4_1), &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let header_len = 12_000;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for _ in 0..3000 {
        let mut image = bytes.clone();
        for _ in 0..rng.random_range(1..8) {
            let at = rng.random_range(0..header_len);
            image[at] = rng.random();
        }
        if let Ok(file) = GgufFile::parse(&image) {
            for name in file.tensors().keys() {
                let t = file.tensor_data(name).unwrap();
                assert_eq!(
                    Some(t.data.len()),
                    t.dtype.bytes_for(t.shape.iter().product())
                );
            }
        }
    }
}
