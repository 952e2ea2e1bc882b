//! `switchyard demo-repo`'s library function on a small synthetic Q4_1 base
//! (fast, every property checked) and on the real SmolLM2 file.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "../engine/tests/support/real_models.rs"]
mod real_models;

use std::fs;
use std::path::{Path, PathBuf};

use switchyard_engine::formats::gguf::GgufFile;
use switchyard_engine::formats::{load_checkpoint, TensorData};
use switchyard_engine::repository::demo::{
    delta_tensor_names, dequantize_tensor, derived as derived_checkpoints, make_demo_repository,
    DemoOptions, DemoRepository, DEFAULT_DERIVED,
};
use switchyard_engine::repository::ModelRepository;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::DType;
use tempfile::TempDir;

fn make(base: &Path, out: &Path) -> DemoRepository {
    let options = DemoOptions {
        base: base.to_path_buf(),
        out: out.to_path_buf(),
        derived: DEFAULT_DERIVED,
    };
    let mut events = 0usize;
    let made = make_demo_repository(&options, &mut |_| events += 1).unwrap();
    assert!(events > 0, "no progress was reported");
    made
}

fn synthetic_base(dir: &Path) -> PathBuf {
    let base = dir.join("synthetic-base.Q4_1.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q4_1,
        seed: 11,
    };
    write_gguf(&spec, &base).unwrap();
    base
}

fn derived_path(out: &Path, suffix: &str) -> PathBuf {
    let model = format!("smollm2-derived-{suffix}");
    out.join(&model).join("1").join(format!("{model}.gguf"))
}

/// Every Q8_0 value is within half a quantization step of its source:
/// `amax / 127 / 2` per 32-element block, plus the f16 rounding of the
/// block scale (relative 2^-11, times at most 127 steps).
fn assert_within_q8_0_tolerance(name: &str, base: &[f32], requantized: &[f32]) {
    assert_eq!(base.len(), requantized.len(), "{name}");
    for (b, r) in base.chunks(32).zip(requantized.chunks(32)) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let step = amax / 127.0;
        let tolerance = step * 0.5 + amax * 2f32.powi(-11) + 1e-7;
        for (x, y) in b.iter().zip(r) {
            assert!(
                (x - y).abs() <= tolerance,
                "{name}: {x} vs {y} (tol {tolerance})"
            );
        }
    }
}

fn tensor(file: &GgufFile, name: &str) -> TensorData {
    file.tensor_data(name).unwrap()
}

#[test]
fn synthetic_demo_repository() {
    let dir = TempDir::new().unwrap();
    let base_path = synthetic_base(dir.path());
    let out = dir.path().join("repo");
    let made = make(&base_path, &out);
    assert_eq!(made.checkpoints.len(), 5);
    let base = GgufFile::open(&base_path).unwrap();

    // Version 1: the base, unchanged.
    let v1 = out.join("smollm2/1/synthetic-base.Q4_1.gguf");
    assert_eq!(fs::read(&v1).unwrap(), fs::read(&base_path).unwrap());

    // Version 2: every Q4_1 matrix now Q8_0, values within Q8_0 rounding.
    let v2 = GgufFile::open(out.join("smollm2/2/smollm2-q8_0.gguf")).unwrap();
    assert_eq!(v2.metadata().get_u64("general.file_type"), Some(7));
    let mut requantized = 0;
    for (name, info) in base.tensors() {
        let (b, r) = (tensor(&base, name), tensor(&v2, name));
        assert_eq!(b.shape, r.shape, "{name}");
        if info.dtype == DType::Q4_1 {
            assert_eq!(r.dtype, DType::Q8_0, "{name}");
            let (bv, rv) = (
                dequantize_tensor(&b).unwrap(),
                dequantize_tensor(&r).unwrap(),
            );
            assert_within_q8_0_tolerance(name, &bv, &rv);
            requantized += 1;
        } else {
            assert_eq!(b.data, r.data, "{name} should be unchanged");
        }
    }
    assert!(requantized > 0);

    // Derived: only the chosen tensors differ, in the same type.
    let n_layers = base.metadata().get_u64("llama.block_count").unwrap() as usize;
    let targets = delta_tensor_names(n_layers);
    let mut derived_bytes = Vec::new();
    for (suffix, _) in derived_checkpoints(DEFAULT_DERIVED) {
        let path = derived_path(&out, &suffix);
        let derived = GgufFile::open(&path).unwrap();
        let general = derived.metadata().get_str("general.name").unwrap();
        assert!(general.contains(&format!("derived-{suffix}")), "{general}");
        assert!(general.contains("NOT a trained model"), "{general}");
        assert_eq!(derived.tensors().len(), base.tensors().len());
        for name in base.tensors().keys() {
            let (b, d) = (tensor(&base, name), tensor(&derived, name));
            assert_eq!((b.dtype, &b.shape), (d.dtype, &d.shape), "{name}");
            if targets.contains(name) {
                assert_ne!(b.data, d.data, "{name} should carry the delta");
            } else {
                assert_eq!(b.data, d.data, "{name} should be byte-identical");
            }
        }
        load_checkpoint(&path).unwrap();
        derived_bytes.push(fs::read(&path).unwrap());
    }
    assert_ne!(
        derived_bytes[0], derived_bytes[1],
        "seeds 1 and 2 gave one model"
    );

    // Deterministic: a second run writes the same bytes.
    let out2 = dir.path().join("again");
    make(&base_path, &out2);
    for (suffix, _) in derived_checkpoints(DEFAULT_DERIVED) {
        assert_eq!(
            fs::read(derived_path(&out, &suffix)).unwrap(),
            fs::read(derived_path(&out2, &suffix)).unwrap()
        );
    }
    // Refreshing in place keeps the base intact and the files the same.
    make(&base_path, &out);
    assert_eq!(fs::read(&v1).unwrap(), fs::read(&base_path).unwrap());

    let listed = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["models", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(json["models"].as_array().unwrap().len(), 4, "{json}");
    assert_eq!(json["models"][0]["default_version"], "1", "{json}");
    assert_eq!(json["models"][0]["versions"][1]["served"], true, "{json}");

    let readme = fs::read_to_string(out.join("README.txt")).unwrap();
    assert!(readme.contains("NOT A TRAINED MODEL"), "{readme}");
    check_repository(&out);
}

/// The repository holds the four demo models with the right versions.
fn check_repository(out: &Path) -> ModelRepository {
    let repo = ModelRepository::open(out).unwrap();
    assert!(repo.problems.is_empty(), "{:?}", repo.problems);
    let names: Vec<_> = repo.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "smollm2",
            "smollm2-derived-a",
            "smollm2-derived-b",
            "smollm2-derived-c"
        ]
    );
    let smollm2 = repo.model("smollm2-135m").unwrap();
    let served: Vec<_> = smollm2
        .served_versions()
        .iter()
        .map(|v| v.version.clone())
        .collect();
    assert_eq!(served, vec!["1", "2"]);
    let (_, default) = repo.resolve("smollm2").unwrap();
    assert_eq!(default.version, "1");
    let (_, v2) = repo.resolve("smollm2-135m@2").unwrap();
    assert!(v2.bytes > default.bytes, "Q8_0 should be larger than Q4_1");
    assert_eq!(v2.parameters, default.parameters);
    for m in &repo.models[1..] {
        assert_eq!(m.versions.len(), 1);
        assert_eq!(m.versions[0].version, "1");
        assert_eq!(m.versions[0].parameters, default.parameters);
    }
    repo
}

/// The real model: CI always fetches it (scripts/fetch-model.sh).
#[test]
fn real_smollm2_demo_repository() {
    let base = real_models::smollm2();
    let dir = TempDir::new().unwrap();
    let out = dir.path().join("repo");
    let made = make(&base, &out);
    let repo = check_repository(&out);
    let (_, v1) = repo.resolve("smollm2@1").unwrap();
    assert_eq!(v1.architecture, "llama");
    assert_eq!(v1.bytes, fs::metadata(&base).unwrap().len());
    let a = made
        .checkpoints
        .iter()
        .find(|c| c.model == "smollm2-derived-a")
        .unwrap();
    assert_eq!(
        a.changed_tensors,
        vec!["blk.28.ffn_down.weight", "blk.29.ffn_down.weight"]
    );
    for (model, version) in repo.models.iter().flat_map(|m| {
        m.versions
            .iter()
            .map(move |v| (m.name.clone(), v.path.clone()))
    }) {
        load_checkpoint(&version).unwrap_or_else(|e| panic!("{model}: {e}"));
    }
}
