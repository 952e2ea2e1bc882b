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
