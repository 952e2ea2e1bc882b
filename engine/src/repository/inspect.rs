//! What a version folder holds: which checkpoint, in which format, of which
//! architecture and size. Loading goes through
//! [`crate::formats::load_checkpoint`], which maps the files and parses
//! headers only (no tensor data is read or dequantized), so a version that
//! inspects cleanly is one the engine can load.

use std::path::{Path, PathBuf};

use crate::formats::{load_checkpoint, quant_mix, CheckpointFormat};

/// One version of a model, as found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoVersion {
    /// The folder name: `1`, `2`, `2024-06-rc1`, ...
    pub version: String,
    /// The `.gguf` file or the Hugging Face folder, ready for
    /// [`crate::formats::load_checkpoint`].
    pub path: PathBuf,
    pub format: CheckpointFormat,
    /// The family: `llama`, `gemma3`, ... (see
    /// [`crate::model::config::Architecture::name`]).
    pub architecture: String,
    /// Tensor types: `Q4_K_M: Q5_0 81, Q4_K 27, Q8_0 10, Q6_K 9` (see
    /// [`crate::formats::quant_mix`]).
    pub quant_mix: String,
    /// Number of weights (elements of every tensor).
    pub parameters: u64,
    /// Bytes on disk (the GGUF file, or every file of the folder).
    pub bytes: u64,
}

/// Inspects the version folder `dir` named `version`; the error says what
/// is wrong with it.
pub(super) fn inspect_version(dir: &Path, version: &str) -> Result<RepoVersion, String> {
    let path = checkpoint_path(dir)?;
    let checkpoint = load_checkpoint(&path).map_err(|e| e.to_string())?;
    let parameters = checkpoint
        .tensors
        .values()
        .map(|t| t.shape.iter().map(|&d| d as u64).product::<u64>())
        .sum();
    let bytes = disk_bytes(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(RepoVersion {
        version: version.to_string(),
        path,
        format: checkpoint.format,
        architecture: checkpoint.config.architecture.name().to_string(),
        quant_mix: quant_mix(&checkpoint),
        parameters,
        bytes,
    })
}

/// The checkpoint inside a version folder: the folder itself when it holds
/// `config.json` (Hugging Face layout), else its one `.gguf` file.
fn checkpoint_path(dir: &Path) -> Result<PathBuf, String> {
    if dir.join("config.json").is_file() {
        return Ok(dir.to_path_buf());
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut ggufs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let path = entry.path();
        let is_gguf = path
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("gguf"));
        if is_gguf && path.is_file() {
            ggufs.push(path);
        }
    }
    ggufs.sort();
    match ggufs.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(
            "holds neither a .gguf file nor a Hugging Face folder (config.json, *.safetensors, \
             tokenizer.json); put one checkpoint in each version folder"
                .into(),
        ),
        many => Err(format!(
            "holds {} .gguf files ({}); a version folder holds exactly one checkpoint, move the \
             others into versions of their own",
            many.len(),
            many.iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Size on disk of a file, or of every file directly inside a folder.
fn disk_bytes(path: &Path) -> std::io::Result<u64> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Ok(meta.len());
    }
    let mut total = 0u64;
    for entry in std::fs::read_dir(path)? {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            total = total.saturating_add(meta.len());
        }
    }
    Ok(total)
}

/// Orders version names: numeric ones numerically (`2` before `10`), then
/// the others lexically.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    match (numeric(a), numeric(b)) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// The value of an all-digit name (leading zeros allowed, any length).
fn numeric(name: &str) -> Option<u128> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::compare_versions;

    #[test]
    fn numeric_versions_sort_numerically_then_names_lexically() {
        let mut v = vec!["10", "b", "2", "1", "a", "01x", "3"];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(v, vec!["1", "2", "3", "10", "01x", "a", "b"]);
    }
}
