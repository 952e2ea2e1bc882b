//! Measured quality (stored by `switchyard eval --save`) as the command
//! line and the admin API show it: per version and suite, with n, the 95%
//! interval and whether the measurement still holds.

use std::path::Path;

use serde_json::{json, Value};
use switchyard_engine::eval::quality::{load_records, QualityRecord};
use switchyard_engine::repository::{ModelRepository, RepoModel};

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
