//! Measured quality stored with the model repository, per `model@version`
//! and suite: `REPO/<model>/.quality/<version>/<suite>.json` (a hidden
//! folder, so the repository scan never takes it for a version).
//!
//! A record remembers the suite's content hash and when it was measured,
//! so a reader can tell a measurement that still holds from one the suite
//! or the checkpoint has since changed under ([`Freshness`]).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::Summary;

/// One suite's result on one version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QualityRecord {
    pub model: String,
    pub version: String,
    /// The suite's name (its file stem).
    pub suite: String,
    /// Where the suite was read from when measured.
    pub suite_path: PathBuf,
    /// blake3 of the suite file's bytes when measured.
    pub suite_hash: String,
    #[serde(flatten)]
    pub summary: Summary,
    /// Unix seconds.
    pub measured_at: u64,
}

/// Whether a record still describes its version on its suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    Fresh,
    /// The suite file now holds other items.
    SuiteChanged,
    /// The suite file is gone (or unreadable): the record cannot be checked.
    SuiteMissing,
    /// The checkpoint was modified after the measurement.
    CheckpointChanged,
}

impl Freshness {
    pub fn as_str(self) -> &'static str {
        match self {
            Freshness::Fresh => "fresh",
            Freshness::SuiteChanged => "stale: the suite changed",
            Freshness::SuiteMissing => "unchecked: the suite file is gone",
            Freshness::CheckpointChanged => "stale: the checkpoint changed",
        }
    }
}

/// blake3 of a suite file's bytes, hex.
pub fn suite_hash(path: &Path) -> std::io::Result<String> {
    Ok(blake3::hash(&std::fs::read(path)?).to_hex().to_string())
}

/// Unix seconds now.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn version_dir(root: &Path, model: &str, version: &str) -> PathBuf {
    root.join(model).join(".quality").join(version)
}

impl QualityRecord {
    /// Where this record lives under repository `root`.
    pub fn path(&self, root: &Path) -> PathBuf {
        version_dir(root, &self.model, &self.version).join(format!("{}.json", self.suite))
    }

    /// Writes the record (a temporary file renamed into place, so a reader
    /// never sees half of one).
    pub fn save(&self, root: &Path) -> std::io::Result<PathBuf> {
        let path = self.path(root);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text + "\n")?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Whether the record still holds for the checkpoint at `checkpoint`.
    pub fn freshness(&self, checkpoint: &Path) -> Freshness {
        match suite_hash(&self.suite_path) {
            Err(_) => return Freshness::SuiteMissing,
            Ok(hash) if hash != self.suite_hash => return Freshness::SuiteChanged,
            Ok(_) => {}
        }
        let modified = std::fs::metadata(checkpoint)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        if modified > self.measured_at {
            Freshness::CheckpointChanged
        } else {
            Freshness::Fresh
        }
    }
}

/// The record of `model@version` on `suite`, if one was stored and reads.
pub fn load_record(root: &Path, model: &str, version: &str, suite: &str) -> Option<QualityRecord> {
    let path = version_dir(root, model, version).join(format!("{suite}.json"));
    read(&path)
}

/// Every record of `model` under `root`, sorted by version then suite.
/// Unreadable files are skipped with a warning: a broken record must not
/// stop listing or serving.
pub fn load_records(root: &Path, model: &str) -> Vec<QualityRecord> {
    let mut out = Vec::new();
    let Ok(versions) = std::fs::read_dir(root.join(model).join(".quality")) else {
        return out;
    };
    for version in versions.flatten() {
        let Ok(files) = std::fs::read_dir(version.path()) else {
            continue;
        };
        for file in files.flatten() {
            let path = file.path();
            if path.extension().is_some_and(|e| e == "json") {
                out.extend(read(&path));
            }
        }
    }
    out.sort_by(|a, b| {
        crate::repository::compare_versions(&a.version, &b.version).then(a.suite.cmp(&b.suite))
    });
    out
}

fn read(path: &Path) -> Option<QualityRecord> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(record) => Some(record),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "skipping an unreadable quality record");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_records_read_back_and_go_stale_when_the_suite_changes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let suite = dir.path().join("s.jsonl");
        std::fs::write(&suite, "{\"prompt\":\"a\",\"answer\":\"b\"}\n").unwrap();
        let checkpoint = dir.path().join("m.gguf");
        std::fs::write(&checkpoint, b"x").unwrap();
        let record = QualityRecord {
            model: "m".into(),
            version: "2".into(),
            suite: "s".into(),
            suite_path: suite.clone(),
            suite_hash: suite_hash(&suite).unwrap(),
            summary: Summary::new(10, 7, 6),
            measured_at: now() + 1,
        };
        record.save(&root).unwrap();
        std::fs::write(root.join("m/.quality/2/broken.json"), "{").unwrap();
        assert_eq!(load_records(&root, "m"), vec![record.clone()]);
        assert_eq!(load_record(&root, "m", "2", "s"), Some(record.clone()));
        assert_eq!(record.freshness(&checkpoint), Freshness::Fresh);
        std::fs::write(&suite, "{\"prompt\":\"a\",\"answer\":\"c\"}\n").unwrap();
        assert_eq!(record.freshness(&checkpoint), Freshness::SuiteChanged);
        std::fs::remove_file(&suite).unwrap();
        assert_eq!(record.freshness(&checkpoint), Freshness::SuiteMissing);
    }
}
