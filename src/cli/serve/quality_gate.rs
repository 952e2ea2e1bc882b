//! Quality-gated activation: when a model's `model.toml` names a
//! `[quality_gate]`, a version becomes active only if its accuracy on the
//! gate's suite is at most `max_drop` below the active version's (see
//! `switchyard_engine::eval::gate`).
//!
//! A version's figure is its stored measurement when that still holds
//! (same suite bytes, checkpoint unchanged since), else the suite is run
//! now on the resident checkpoint and the result stored with the
//! repository. Loading a gated version measures it, so activation usually
//! only compares two stored numbers.

use std::path::Path;

use serde_json::{json, Value};
use switchyard_engine::eval::gate::{judge, read_gate, QualityGate};
use switchyard_engine::eval::quality::{load_record, now, suite_hash, Freshness, QualityRecord};
use switchyard_engine::eval::{evaluate, EvalOptions, Suite, Summary};
use switchyard_engine::repository::ModelRepository;
use switchyard_engine::Engine;
use switchyard_kernels::Backend;
use switchyard_router::admin::{AdminError, AdminErrorKind};
use switchyard_seam::CheckpointRef;

fn invalid(message: String) -> AdminError {
    AdminError {
        kind: AdminErrorKind::Invalid,
        message,
    }
}

/// The gate of `model` in the repository at `root`, if it has one.
pub fn gate_of(root: &Path, model: &str) -> Result<Option<QualityGate>, AdminError> {
    let repository = ModelRepository::open(root).map_err(|e| invalid(e.to_string()))?;
    let Some(entry) = repository.model(model) else {
        return Ok(None);
    };
    read_gate(&root.join(&entry.name)).map_err(invalid)
}

/// `model@version`'s accuracy on the gate's suite: stored if fresh, else measured now.
pub fn measure<B: Backend>(
    engine: &Engine<B>,
    root: &Path,
    gate: &QualityGate,
    model: &str,
    version: &str,
) -> Result<Summary, AdminError> {
    let registry = engine.registry();
    let checkpoint = registry
        .resolve_spec(&CheckpointRef::new(model, version).into())
        .map_err(|e| AdminError {
            kind: AdminErrorKind::Conflict,
            message: format!(
                "the quality gate needs {model}@{version} loaded: {}",
                e.message
            ),
        })?;
    let suite = Suite::load(&gate.suite).map_err(|e| invalid(format!("quality gate: {e}")))?;
    if let Some(record) = load_record(root, model, version, &suite.name()) {
        if record.freshness(&checkpoint.source) == Freshness::Fresh {
            return Ok(record.summary);
        }
    }
    let started = std::time::Instant::now();
    let report = evaluate(
        registry.backend().as_ref(),
        &checkpoint.model,
        &checkpoint.tokenizer,
        &suite,
        &EvalOptions::default(),
    )
    .map_err(|e| invalid(format!("quality gate {}: {e}", gate.suite.display())))?;
    tracing::info!(
        checkpoint = %checkpoint.id,
        suite = %suite.name(),
        acc = report.summary.acc,
        n = report.summary.n,
        seconds = started.elapsed().as_secs_f64(),
        "quality gate measured"
    );
    let record = QualityRecord {
        model: model.to_string(),
        version: version.to_string(),
        suite: suite.name(),
        suite_path: gate.suite.clone(),
        suite_hash: suite_hash(&gate.suite)
            .map_err(|e| invalid(format!("cannot read {}: {e}", gate.suite.display())))?,
        summary: report.summary.clone(),
        measured_at: now(),
    };
    if let Err(error) = record.save(root) {
        tracing::warn!(%error, "cannot store the quality gate's measurement");
    }
    Ok(report.summary)
}

/// Checks activating `model@version` against its gate. `Ok(None)`: no gate
/// (or nothing active to compare with); `Ok(Some(figures))`: passed or
/// forced, the figures to report; `Err`: refused (409) or unmeasurable.
pub fn check_activation<B: Backend>(
    engine: &Engine<B>,
    root: &Path,
    model: &str,
    version: &str,
    force: bool,
) -> Result<Option<Value>, AdminError> {
    let Some(gate) = gate_of(root, model)? else {
        return Ok(None);
    };
    let Ok(active) = engine.registry().resolve(model) else {
        return Ok(None);
    };
    let active_version = active.id.version.clone();
    if active_version == version {
        return Ok(None);
    }
    if force {
        return Ok(Some(
            json!({ "suite": gate.suite.display().to_string(), "forced": true }),
        ));
    }
    let candidate = measure(engine, root, &gate, model, version)?;
    let current = measure(engine, root, &gate, model, &active_version)?;
    let candidate_id = CheckpointRef::new(model, version).to_string();
    let active_id = CheckpointRef::new(model, &active_version).to_string();
    judge(&gate, &candidate_id, &candidate, &active_id, &current).map_err(|refusal| {
        AdminError {
            kind: AdminErrorKind::Conflict,
            message: refusal.to_string(),
        }
    })?;
    Ok(Some(json!({
        "suite": gate.suite.display().to_string(),
        "max_drop": gate.max_drop,
        "candidate": candidate,
        "active": current,
        "forced": false,
    })))
}
