//! Measured quality (stored by `switchyard eval --save`) as the command
//! line and the admin API show it: per version and suite, with n, the 95%
//! interval and whether the measurement still holds.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use switchyard_engine::eval::quality::{load_record, load_records, Freshness, QualityRecord};
use switchyard_engine::repository::{ModelRepository, RepoModel};
use switchyard_policies::{Measured, Measurement, QualitySource};

/// The measurements stored in a model repository, as a policy's `quality_from` reads
/// them: only a fresh record counts (see [`Freshness`]).
#[derive(Debug, Clone)]
pub struct RepoQuality {
    root: PathBuf,
}

impl RepoQuality {
    /// Reads the records of the repository at `root`.
    pub fn new(root: &Path) -> Self {
        RepoQuality {
            root: root.to_path_buf(),
        }
    }
}

impl QualitySource for RepoQuality {
    fn measurement(&self, model: &str, version: &str, suite: &str) -> Measurement {
        let Some(record) = load_record(&self.root, model, version, suite) else {
            return Measurement::Missing {
                why: format!(
                    "no measurement of {model}@{version} on `{suite}` in {} (switchyard eval --repo {} --model {model}@{version} --suite <{suite}.jsonl> --save)",
                    self.root.display(),
                    self.root.display()
                ),
            };
        };
        let measured = Measured {
            acc: record.summary.acc,
            n: record.summary.n as u64,
            ci95: record.summary.ci95,
        };
        // The repository is scanned again for the checkpoint's file: a version
        // published or replaced since the server started is judged as it is now.
        let checkpoint = ModelRepository::open(&self.root).ok().and_then(|repo| {
            repo.model(model)
                .and_then(|m| m.version(version))
                .map(|v| v.path.clone())
        });
        let Some(checkpoint) = checkpoint else {
            return Measurement::Missing {
                why: format!(
                    "{model}@{version} is not in the repository {}",
                    self.root.display()
                ),
            };
        };
        match record.freshness(&checkpoint) {
            Freshness::Fresh => Measurement::Fresh { measured },
            other => Measurement::Stale {
                measured,
                why: other.as_str().to_string(),
            },
        }
    }

    /// Names, sizes and modification times of every stored record and of the suites
    /// they were measured on: a new `--save`, a gate's run or an edited suite changes it.
    fn fingerprint(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let Ok(models) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        let mut stamps = Vec::new();
        for model in models.flatten() {
            let Ok(versions) = std::fs::read_dir(model.path().join(".quality")) else {
                continue;
            };
            for version in versions.flatten() {
                for file in std::fs::read_dir(version.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let path = file.path();
                    stamps.push(stamp(&path));
                    if let Some(record) =
                        path.file_stem().and_then(|s| s.to_str()).and_then(|suite| {
                            let version = version.file_name();
                            let model = model.file_name();
                            load_record(&self.root, model.to_str()?, version.to_str()?, suite)
                        })
                    {
                        stamps.push(stamp(&record.suite_path));
                    }
                }
            }
        }
        stamps.sort();
        stamps.hash(&mut hasher);
        hasher.finish()
    }
}

/// A file's path, modification time (ns) and length; zeros when it is gone.
fn stamp(path: &Path) -> (PathBuf, u128, u64) {
    let meta = std::fs::metadata(path).ok();
    let modified = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    (path.to_path_buf(), modified, meta.map_or(0, |m| m.len()))
}

/// One record as JSON, with its freshness against the checkpoint at `checkpoint`.
pub fn record_json(record: &QualityRecord, checkpoint: Option<&Path>) -> Value {
    let freshness = checkpoint.map(|c| record.freshness(c).as_str());
    json!({
        "version": record.version,
        "suite": record.suite,
        "n": record.summary.n,
        "acc": record.summary.acc,
        "acc_norm": record.summary.acc_norm,
        "ci95": record.summary.ci95,
        "measured_at": record.measured_at,
        "freshness": freshness,
    })
}

/// Every stored record of `model`, as JSON.
pub fn model_quality(root: &Path, model: &RepoModel) -> Vec<Value> {
    load_records(root, &model.name)
        .iter()
        .map(|r| {
            let checkpoint = model.version(&r.version).map(|v| v.path.as_path());
            record_json(r, checkpoint)
        })
        .collect()
}

/// The repository's measured quality as lines for `switchyard models`
/// (empty when nothing was measured).
pub fn quality_lines(repo: &ModelRepository) -> String {
    let mut out = String::new();
    for model in &repo.models {
        for record in load_records(&repo.root, &model.name) {
            let s = &record.summary;
            let freshness = model
                .version(&record.version)
                .map_or("version gone", |v| record.freshness(&v.path).as_str());
            out.push_str(&format!(
                "  {}@{}  {}  acc {:.3} [{:.3}, {:.3}]  acc_norm {:.3}  n {}  ({freshness})\n",
                model.name,
                record.version,
                record.suite,
                s.acc,
                s.ci95[0],
                s.ci95[1],
                s.acc_norm,
                s.n
            ));
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("\nmeasured quality (switchyard eval --save):\n{out}")
}

/// What the repository measured for each model of a routing policy, beside
/// the quality the policy declares: every stored suite of each policy
/// version with n, interval and freshness, or that none was measured.
pub fn policy_measurements(repo: &ModelRepository, policy: &switchyard_policies::Policy) -> Value {
    let models: Vec<Value> = policy
        .models()
        .iter()
        .map(|m| {
            let entry = repo.model(&m.name);
            let records: Vec<Value> = entry
                .map(|e| {
                    load_records(&repo.root, &e.name)
                        .iter()
                        .filter(|r| m.versions.iter().any(|v| **v == *r.version))
                        .map(|r| record_json(r, e.version(&r.version).map(|v| v.path.as_path())))
                        .collect()
                })
                .unwrap_or_default();
            let note = match (entry, records.is_empty()) {
                (None, _) => "not in the repository: the declared quality is used",
                (Some(_), true) => {
                    "no measurement (switchyard eval --save): the declared quality is used"
                }
                (Some(_), false) => "measured",
            };
            json!({
                "model": &*m.name,
                "declared_quality": m.quality,
                "measured": records,
                "note": note,
            })
        })
        .collect();
    Value::from(models)
}

/// [`policy_measurements`] as text lines.
pub fn policy_measurement_lines(measurements: &Value) -> String {
    let mut out = String::from("measured quality (from the repository):\n");
    for m in measurements.as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {}  declared {:.3}: {}\n",
            m["model"].as_str().unwrap_or("?"),
            m["declared_quality"].as_f64().unwrap_or(f64::NAN),
            m["note"].as_str().unwrap_or("")
        ));
        for r in m["measured"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "    @{} {}  acc {:.3} [{:.3}, {:.3}]  n {}  ({})\n",
                r["version"].as_str().unwrap_or("?"),
                r["suite"].as_str().unwrap_or("?"),
                r["acc"].as_f64().unwrap_or(f64::NAN),
                r["ci95"][0].as_f64().unwrap_or(f64::NAN),
                r["ci95"][1].as_f64().unwrap_or(f64::NAN),
                r["n"].as_u64().unwrap_or(0),
                r["freshness"].as_str().unwrap_or("unchecked"),
            ));
        }
    }
    out
}
