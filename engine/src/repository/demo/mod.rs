//! A demo model repository made from one real GGUF checkpoint (SmolLM2-135M
//! Instruct Q4_1 in practice):
//!
//! ```text
//! OUT/
//!   README.txt                what each checkpoint is
//!   smollm2/model.toml        alias smollm2-135m, default 1, all versions served
//!   smollm2/1/<base file>     the base, unchanged (hard link or copy)
//!   smollm2/2/smollm2-q8_0.gguf
//!                             every quantized matrix re-quantized to Q8_0
//!   smollm2-derived-{a,b,c}/1/smollm2-derived-{a,b,c}.gguf
//!                             base + a seeded rank-4 delta on the last two
//!                             layers' ffn_down (seeds 1, 2, 3)
//! ```
//!
//! The derived checkpoints are NOT trained models: they exist to give the
//! server several checkpoints of one architecture that answer differently
//! and share most tensors byte for byte. Output is deterministic.

mod report;
mod tensors;
mod write;

use std::path::{Path, PathBuf};

use switchyard_kernels::DType;

use crate::formats::gguf::{model_config, GgufFile, MetaValue};
use crate::formats::{load_checkpoint, CheckpointFormat};
pub use report::{DemoError, DemoEvent};
pub use tensors::{
    add_low_rank_delta, delta_rng, dequantize_tensor, requantize, rms, rows_cols, DELTA_RANK,
    DELTA_STRENGTH,
};

/// The model folder of the base and its re-quantized version.
pub const BASE_MODEL: &str = "smollm2";
/// The alias the demo gives [`BASE_MODEL`].
pub const BASE_ALIAS: &str = "smollm2-135m";
/// The file name of version 2.
pub const Q8_0_FILE: &str = "smollm2-q8_0.gguf";
/// How many derived checkpoints a demo repository has unless asked for more.
pub const DEFAULT_DERIVED: usize = 3;
/// The most derived checkpoints: one per letter of the suffix alphabet.
pub const MAX_DERIVED: usize = 26;

/// Suffix and delta seed of each of the first `count` derived checkpoints:
/// `a` with seed 1, `b` with seed 2, and so on, so that asking for more
/// keeps the first ones byte for byte.
pub fn derived(count: usize) -> impl Iterator<Item = (String, u64)> {
    (b'a'..=b'z')
        .zip(1..)
        .take(count.min(MAX_DERIVED))
        .map(|(letter, seed)| (char::from(letter).to_string(), seed))
}
/// `general.file_type` of a mostly-Q8_0 file (llama.cpp's `LLAMA_FTYPE_MOSTLY_Q8_0`).
const FILE_TYPE_Q8_0: u32 = 7;

/// Where to read the base and write the repository.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// The base GGUF checkpoint; never modified.
    pub base: PathBuf,
    /// The repository folder to create or refresh.
    pub out: PathBuf,
    /// How many derived checkpoints to write ([`DEFAULT_DERIVED`] for the
    /// demo; the multi-model benchmark asks for more).
    pub derived: usize,
}

/// One checkpoint the demo wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoCheckpoint {
    pub model: String,
    pub version: String,
    pub path: PathBuf,
    /// The tensors whose bytes differ from the base's.
    pub changed_tensors: Vec<String>,
}

/// What [`make_demo_repository`] made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoRepository {
    pub root: PathBuf,
    pub checkpoints: Vec<DemoCheckpoint>,
}

/// The tensors the derived checkpoints change: `ffn_down` of the last two
/// layers (of one layer when the model has only one).
pub fn delta_tensor_names(n_layers: usize) -> Vec<String> {
    (n_layers.saturating_sub(2)..n_layers)
        .map(|i| format!("blk.{i}.ffn_down.weight"))
        .collect()
}

/// The `general.name` of the derived checkpoint with suffix `suffix`.
pub fn derived_general_name(suffix: &str) -> String {
    format!("SmolLM2-135M derived-{suffix} (base + seeded low-rank delta, NOT a trained model)")
}

/// Makes the demo repository in `options.out` from `options.base`,
/// reporting progress through `progress`. Running it again rewrites the
/// same bytes.
pub fn make_demo_repository(
    options: &DemoOptions,
    progress: &mut dyn FnMut(DemoEvent<'_>),
) -> Result<DemoRepository, DemoError> {
    // Full validation first: a base the engine cannot serve makes no demo.
    let checkpoint = load_checkpoint(&options.base).map_err(DemoError::Base)?;
    if checkpoint.format != CheckpointFormat::Gguf {
        return Err(DemoError::BaseNotGguf {
            path: options.base.clone(),
        });
    }
    let base = GgufFile::open(&options.base).map_err(DemoError::Base)?;
    let n_layers = model_config(&base).map_err(DemoError::Base)?.n_layers;
    let base_name = base
        .metadata()
        .get_str("general.name")
        .unwrap_or("base")
        .to_string();
    let out = &options.out;
    let mut checkpoints = Vec::new();

    let base_file = options
        .base
        .file_name()
        .map_or_else(|| "base.gguf".into(), |n| n.to_os_string());
    let v1 = out.join(BASE_MODEL).join("1").join(base_file);
    write::place_base(&options.base, &v1, "smollm2 v1 (base)", progress)?;
    checkpoints.push(DemoCheckpoint {
        model: BASE_MODEL.into(),
        version: "1".into(),
        path: v1,
        changed_tensors: Vec::new(),
    });

    checkpoints.push(write_q8_0(&base, &options.base, out, &base_name, progress)?);
    for (suffix, seed) in derived(options.derived) {
        checkpoints.push(write_derived_checkpoint(
            &base,
            &options.base,
            out,
            &suffix,
            seed,
            &delta_tensor_names(n_layers),
            progress,
        )?);
    }
    write::write_text(&out.join(BASE_MODEL).join("model.toml"), &model_toml())?;
    write::write_text(&out.join("README.txt"), &readme(options, n_layers))?;
    Ok(DemoRepository {
        root: out.clone(),
        checkpoints,
    })
}

fn write_q8_0(
    base: &GgufFile,
    base_path: &Path,
    out: &Path,
    base_name: &str,
    progress: &mut dyn FnMut(DemoEvent<'_>),
) -> Result<DemoCheckpoint, DemoError> {
    let path = out.join(BASE_MODEL).join("2").join(Q8_0_FILE);
    let mut changed = Vec::new();
    let mut to_q8_0 = |name: &str, t: &crate::formats::TensorData| {
        if !t.dtype.is_quantized() || t.dtype == DType::Q8_0 || t.shape.len() < 2 {
            return Ok(None);
        }
        let bytes = requantize(t, DType::Q8_0).map_err(|source| DemoError::Tensor {
            base: base_path.to_path_buf(),
            tensor: name.to_string(),
            source,
        })?;
        changed.push(name.to_string());
        Ok(Some((DType::Q8_0, bytes.into())))
    };
    let overrides = [
        (
            "general.name",
            MetaValue::String(format!("{base_name} (re-quantized to Q8_0)")),
        ),
        ("general.file_type", MetaValue::U32(FILE_TYPE_Q8_0)),
    ];
    write::write_derived(
        base,
        &path,
        "smollm2 v2 (q8_0)",
        &overrides,
        &mut to_q8_0,
        progress,
    )?;
    Ok(DemoCheckpoint {
        model: BASE_MODEL.into(),
        version: "2".into(),
        path,
        changed_tensors: changed,
    })
}

fn write_derived_checkpoint(
    base: &GgufFile,
    base_path: &Path,
    out: &Path,
    suffix: &str,
    seed: u64,
    targets: &[String],
    progress: &mut dyn FnMut(DemoEvent<'_>),
) -> Result<DemoCheckpoint, DemoError> {
    let model = format!("{BASE_MODEL}-derived-{suffix}");
    let path = out.join(&model).join("1").join(format!("{model}.gguf"));
    // One generator per checkpoint, drawn in tensor-name order: the same
    // seed always gives the same bytes.
    let mut rng = delta_rng(seed);
    let mut changed = Vec::new();
    let mut add_delta = |name: &str, t: &crate::formats::TensorData| {
        if !targets.iter().any(|target| target == name) {
            return Ok(None);
        }
        let bytes = add_low_rank_delta(t, &mut rng).map_err(|source| DemoError::Tensor {
            base: base_path.to_path_buf(),
            tensor: name.to_string(),
            source,
        })?;
        changed.push(name.to_string());
        Ok(Some((t.dtype, bytes.into())))
    };
    let overrides = [(
        "general.name",
        MetaValue::String(derived_general_name(suffix)),
    )];
    write::write_derived(base, &path, &model, &overrides, &mut add_delta, progress)?;
    Ok(DemoCheckpoint {
        model,
        version: "1".into(),
        path,
        changed_tensors: changed,
    })
}

fn model_toml() -> String {
    format!(
        "# Written by `switchyard demo-repo`.\n\
         aliases = [\"{BASE_ALIAS}\"]\n\
         default_version = \"1\"\n\
         \n\
         [version_policy]\n\
         all = true\n"
    )
}

fn readme(options: &DemoOptions, n_layers: usize) -> String {
    let base = &options.base;
    let targets = delta_tensor_names(n_layers).join(", ");
    let base_name = base.file_name().map_or_else(
        || base.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut text = format!(
        "Switchyard demo model repository, made by `switchyard demo-repo` from\n\
         {base_name}.\n\
         \n\
         smollm2/1/{base_name}\n\
         \x20   The base checkpoint, byte for byte (a hard link or a copy).\n\
         smollm2/2/{Q8_0_FILE}\n\
         \x20   The same model re-quantized: every quantized matrix dequantized and\n\
         \x20   re-encoded as Q8_0; other tensors unchanged. Same weights up to rounding.\n\
         smollm2/model.toml\n\
         \x20   Alias {BASE_ALIAS}, default version 1, every version served.\n"
    );
    for (suffix, seed) in derived(options.derived) {
        text.push_str(&format!(
            "smollm2-derived-{suffix}/1/smollm2-derived-{suffix}.gguf\n\
             \x20   DERIVED, NOT A TRAINED MODEL: the base plus a random rank-{DELTA_RANK} delta\n\
             \x20   (seed {seed}, {:.0}% of each weight's RMS) on {targets},\n\
             \x20   re-quantized to the tensor's own type. Every other tensor is byte-identical\n\
             \x20   to the base, so content-hash deduplication shares it.\n",
            DELTA_STRENGTH * 100.0
        ));
    }
    text.push_str(
        "\nThe derived checkpoints exist to exercise multi-checkpoint serving: they share\n\
         the base's architecture and most of its tensors, and answer some prompts\n\
         differently. Their outputs carry no meaning beyond that.\n",
    );
    text
}
