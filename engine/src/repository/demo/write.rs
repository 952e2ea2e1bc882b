//! Writing the demo checkpoints: a GGUF file made from the base with some
//! tensors replaced, and the base itself placed by hard link or copy. Every
//! file is written beside its destination and renamed into place, so an
//! existing file (perhaps a hard link to the base) is never written through.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use switchyard_kernels::DType;

use super::report::{DemoError, DemoEvent};
use crate::formats::gguf::{GgufFile, GgufWriter, MetaValue};
use crate::formats::TensorData;

/// What becomes of one base tensor in a new checkpoint.
pub(super) type Transform<'a> =
    dyn FnMut(&str, &TensorData) -> Result<Option<(DType, Bytes)>, DemoError> + 'a;

/// Writes `out`: the base's metadata with `overrides` applied, and every
/// tensor as `transform` makes it (`None`: the base's bytes unchanged).
pub(super) fn write_derived(
    base: &GgufFile,
    out: &Path,
    label: &str,
    overrides: &[(&str, MetaValue)],
    transform: &mut Transform<'_>,
    progress: &mut dyn FnMut(DemoEvent<'_>),
) -> Result<u64, DemoError> {
    create_parent(out)?;
    let tmp = temp_path(out);
    let mut writer = GgufWriter::new(&tmp);
    for (key, value) in &base.metadata().entries {
        // The writer owns the alignment: set through it so the data layout
        // and the key agree.
        if key == "general.alignment" {
            continue;
        }
        writer.add_metadata(key.clone(), value.clone());
    }
    if let Ok(alignment) = u32::try_from(base.alignment()) {
        if base.metadata().get("general.alignment").is_some() {
            writer.set_alignment(alignment)?;
        }
    }
    for (key, value) in overrides {
        writer.add_metadata(*key, value.clone());
    }
    progress(DemoEvent::Started {
        label,
        path: out,
        tensors: base.tensors().len(),
    });
    for name in base.tensors().keys() {
        let tensor = base.tensor_data(name)?;
        let (dtype, data) = match transform(name, &tensor)? {
            Some(replaced) => replaced,
            None => (tensor.dtype, tensor.data.clone()),
        };
        writer.add_tensor(name.clone(), dtype, &tensor.shape, data)?;
        progress(DemoEvent::Tensor { label, name });
    }
    writer.write()?;
    rename(&tmp, out)?;
    let bytes = file_len(out)?;
    progress(DemoEvent::Finished {
        label,
        path: out,
        bytes,
        how: "written",
    });
    Ok(bytes)
}

/// Places the base file at `out` unchanged: a hard link when both are on
/// one filesystem, else a copy.
pub(super) fn place_base(
    base: &Path,
    out: &Path,
    label: &str,
    progress: &mut dyn FnMut(DemoEvent<'_>),
) -> Result<(), DemoError> {
    create_parent(out)?;
    progress(DemoEvent::Started {
        label,
        path: out,
        tensors: 0,
    });
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y);
    let how = if same(base, out) {
        // The base already lives there: removing it would lose it.
        "already in place"
    } else {
        let tmp = temp_path(out);
        remove_if_exists(&tmp)?;
        let how = match std::fs::hard_link(base, &tmp) {
            Ok(()) => "hard-linked",
            Err(_) => {
                std::fs::copy(base, &tmp).map_err(|source| DemoError::Write {
                    path: tmp.clone(),
                    source,
                })?;
                "copied"
            }
        };
        rename(&tmp, out)?;
        how
    };
    progress(DemoEvent::Finished {
        label,
        path: out,
        bytes: file_len(out)?,
        how,
    });
    Ok(())
}

/// Writes a small text file (README, model.toml) by temporary file and rename.
pub(super) fn write_text(path: &Path, text: &str) -> Result<(), DemoError> {
    create_parent(path)?;
    let tmp = temp_path(path);
    std::fs::write(&tmp, text).map_err(|source| DemoError::Write {
        path: tmp.clone(),
        source,
    })?;
    rename(&tmp, path)
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

fn create_parent(path: &Path) -> Result<(), DemoError> {
    match path.parent() {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|source| DemoError::Write {
            path: dir.to_path_buf(),
            source,
        }),
        None => Ok(()),
    }
}

fn remove_if_exists(path: &Path) -> Result<(), DemoError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DemoError::Write {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), DemoError> {
    std::fs::rename(from, to).map_err(|source| DemoError::Write {
        path: to.to_path_buf(),
        source,
    })
}

fn file_len(path: &Path) -> Result<u64, DemoError> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| DemoError::Write {
            path: path.to_path_buf(),
            source,
        })
}
