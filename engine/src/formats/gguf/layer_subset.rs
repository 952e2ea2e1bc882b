//! A checkpoint made of some of another's layers: the draft model of
//! self-speculation (`switchyard layer-draft`).
//!
//! Speculative decoding needs a draft of the same tokenizer
//! (`crate::speculate::DraftModel`); where no smaller model of the family
//! is at hand, the model itself with some layers left out is one. The
//! residual stream makes that work untrained: each layer adds a correction
//! to its input, so skipping a few of them leaves the final norm and the
//! output matrix reading a stream close to the full model's, and its
//! argmax agrees with the full model's on many tokens. It is cheaper per
//! token by the bytes of the layers left out (the embedding, final norm and
//! output matrix are read in full).
//!
//! The file keeps the base's metadata, tokenizer and non-layer tensors as
//! they are, and its layers `keep[i]` renumbered `blk.i.*` with
//! `{arch}.block_count` set to their count. Only for architectures whose
//! layers are all alike: a sliding-window model (Gemma 2 and 3, by layer
//! position) would change which layers attend globally.

use std::path::{Path, PathBuf};

use super::file::GgufFile;
use super::metadata::MetaValue;
use super::writer::GgufWriter;
use crate::formats::FormatError;

/// Writes `out`: `base` with only its layers `keep` (ascending, distinct,
/// each below the base's layer count). Written beside `out` and renamed
/// into place. Returns the bytes written.
pub fn write_layer_subset(base: &GgufFile, keep: &[usize], out: &Path) -> Result<u64, FormatError> {
    let unwritable = |reason: String| FormatError::Unwritable {
        path: out.to_path_buf(),
        reason,
    };
    let meta = base.metadata();
    let arch = meta.get_str("general.architecture").ok_or_else(|| {
        unwritable(format!(
            "{} has no general.architecture",
            base.path().display()
        ))
    })?;
    let count_key = format!("{arch}.block_count");
    let layers = meta
        .get_u64(&count_key)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| unwritable(format!("{} has no {count_key}", base.path().display())))?;
    if meta
        .get(&format!("{arch}.attention.sliding_window"))
        .is_some()
        || arch.starts_with("gemma")
    {
        return Err(unwritable(format!(
            "{arch} layers differ by position (sliding-window and global attention): a subset \
             would change which layers attend globally"
        )));
    }
    check_keep(keep, layers).map_err(unwritable)?;

    let tmp = partial_path(out);
    let mut writer = GgufWriter::new(&tmp);
    for (key, value) in &meta.entries {
        // The writer owns the alignment: set through it so the data layout
        // and the key agree.
        if key == "general.alignment" {
            continue;
        }
        let value = match value {
            _ if *key == count_key => with_count(value, keep.len()),
            // Per-layer arrays (some architectures size heads by layer).
            MetaValue::Array(items)
                if key.starts_with(&format!("{arch}.")) && items.len() == layers =>
            {
                MetaValue::Array(keep.iter().map(|&l| items[l].clone()).collect())
            }
            _ => value.clone(),
        };
        writer.add_metadata(key.clone(), value);
    }
    if meta.get("general.alignment").is_some() {
        let alignment = u32::try_from(base.alignment())
            .map_err(|_| unwritable(format!("alignment {} is too large", base.alignment())))?;
        writer.set_alignment(alignment)?;
    }
    let name = meta.get_str("general.name").unwrap_or(arch);
    writer.add_metadata(
        "general.name",
        MetaValue::String(format!("{name} (layers {} of {layers})", spell(keep))),
    );
    for tensor in base.tensors().keys() {
        let renamed = match layer_of(tensor) {
            None => tensor.clone(),
            Some((layer, rest)) => match keep.iter().position(|&k| k == layer) {
                Some(new) => format!("blk.{new}.{rest}"),
                None => continue,
            },
        };
        let data = base.tensor_data(tensor)?;
        writer.add_tensor(renamed, data.dtype, &data.shape, data.data)?;
    }
    writer.write()?;
    std::fs::rename(&tmp, out).map_err(|source| FormatError::Write {
        path: out.to_path_buf(),
        source,
    })?;
    std::fs::metadata(out)
        .map(|m| m.len())
        .map_err(|source| FormatError::Write {
            path: out.to_path_buf(),
            source,
        })
}

/// Why `keep` is not a usable subset of `layers` layers.
fn check_keep(keep: &[usize], layers: usize) -> Result<(), String> {
    if keep.is_empty() {
        return Err("no layers to keep".into());
    }
    if let Some(&bad) = keep.iter().find(|&&l| l >= layers) {
        return Err(format!(
            "layer {bad} does not exist: the model has layers 0 to {}",
            layers - 1
        ));
    }
    if keep.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("layers {keep:?} are not ascending and distinct"));
    }
    Ok(())
}

/// `blk.7.attn_q.weight` -> (7, "attn_q.weight").
fn layer_of(tensor: &str) -> Option<(usize, &str)> {
    let rest = tensor.strip_prefix("blk.")?;
    let (index, rest) = rest.split_once('.')?;
    Some((index.parse().ok()?, rest))
}

/// The block count in the base's integer type.
fn with_count(value: &MetaValue, count: usize) -> MetaValue {
    match value {
        MetaValue::U32(_) => MetaValue::U32(count as u32),
        MetaValue::I32(_) => MetaValue::I32(count as i32),
        MetaValue::U64(_) => MetaValue::U64(count as u64),
        MetaValue::I64(_) => MetaValue::I64(count as i64),
        MetaValue::U16(_) => MetaValue::U16(count as u16),
        MetaValue::I16(_) => MetaValue::I16(count as i16),
        MetaValue::U8(_) => MetaValue::U8(count as u8),
        MetaValue::I8(_) => MetaValue::I8(count as i8),
        _ => MetaValue::U32(count as u32),
    }
}

/// `[0, 1, 2, 5, 7, 8]` -> "0-2,5,7-8".
pub fn spell(keep: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < keep.len() {
        let start = keep[i];
        while i + 1 < keep.len() && keep[i + 1] == keep[i] + 1 {
            i += 1;
        }
        parts.push(if keep[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", keep[i])
        });
        i += 1;
    }
    parts.join(",")
}

/// "0-2,5,7-8" -> `[0, 1, 2, 5, 7, 8]` (ascending, distinct).
pub fn parse_layers(text: &str) -> Result<Vec<usize>, String> {
    let mut keep = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("'{part}' is not a layer number or a range like 0-7"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b {
                    return Err(format!("the range '{part}' runs backwards"));
                }
                keep.extend(a..=b);
            }
            None => keep.push(number(part)?),
        }
    }
    keep.sort_unstable();
    keep.dedup();
    if keep.is_empty() {
        return Err(format!("'{text}' names no layers"));
    }
    Ok(keep)
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_lists_parse_and_spell_back() {
        assert_eq!(
            parse_layers("0-2, 5,7-8").as_deref(),
            Ok(&[0, 1, 2, 5, 7, 8][..])
        );
        assert_eq!(parse_layers("3,1,1").as_deref(), Ok(&[1, 3][..]));
        assert_eq!(spell(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert!(parse_layers("4-2").unwrap_err().contains("backwards"));
        assert!(parse_layers("a").unwrap_err().contains("'a'"));
        assert!(parse_layers(",").unwrap_err().contains("no layers"));
    }

    #[test]
    fn a_layer_past_the_model_is_refused() {
        assert!(check_keep(&[0, 30], 30).unwrap_err().contains("layer 30"));
        assert!(check_keep(&[], 30).is_err());
        assert!(check_keep(&[0, 29], 30).is_ok());
    }
}
