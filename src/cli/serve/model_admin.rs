//! The admin API's model lifecycle over the engine: list, status, load,
//! unload, activate, rollback. Loads run on the admin's blocking pool,
//! never on the executor thread, so serving goes on while a version loads.

use std::sync::Arc;

use serde_json::{json, Value};
use switchyard_router::admin::{AdapterRequest, AdminError, AdminErrorKind, ModelAdmin};

use super::admin_error::admin_error;
use super::repository::RepositoryWatch;
use super::{adapter_admin, quality_gate};
use switchyard_engine::Engine;
use switchyard_kernels::Backend;

/// The engine's lifecycle, as the admin API sees it.
pub struct EngineAdmin<B: Backend> {
    engine: Arc<Engine<B>>,
    /// The model repository, rescanned before a load so that a version
    /// published after startup can be loaded; `None` when serving files.
    repository: Option<RepositoryWatch>,
}

impl<B: Backend> EngineAdmin<B> {
    pub fn new(engine: Arc<Engine<B>>, repository: Option<RepositoryWatch>) -> Self {
        EngineAdmin { engine, repository }
    }
}

impl<B: Backend> ModelAdmin for EngineAdmin<B> {
    fn cache(&self) -> Value {
        let scopes: Vec<Value> = (self.engine.executor().cache_use().into_iter())
            .map(|s| {
                json!({
                    "scope": s.scope,
                    "blocks": s.blocks,
                    "bytes": s.bytes,
                    "hit_tokens": s.hit_tokens,
                    "miss_tokens": s.miss_tokens,
                })
            })
            .collect();
        json!({ "scopes": scopes })
    }

    fn models(&self) -> Value {
        let registry = self.engine.registry();
        let quality = self.repository.as_ref().map(|r| quality_json(r.root()));
        json!({
            "models": registry.status(),
            "memory": registry.memory(),
            // Where resident weights live: the backend's memory (`cpu-…`:
            // RAM; `cuda-…`: the GPU's, so `ram` tiers mean device memory).
            "device": registry.backend().name(),
            "quality": quality,
        })
    }

    fn status(&self) -> Value {
        let registry = self.engine.registry();
        let executor = self.engine.executor();
        let queues: Vec<Value> = registry
            .status()
            .into_iter()
            .flat_map(|model| {
                let name = model.name;
                model
                    .versions
                    .into_iter()
                    .filter(|v| v.in_flight > 0 || v.queued > 0)
                    .map(move |v| {
                        json!({
                            "model": name,
                            "version": v.version,
                            "queued": v.queued,
                            "in_flight": v.in_flight,
                        })
                    })
            })
            .collect();
        json!({
            "executor": {
                "running": executor.is_running(),
                "queued": executor.queue_depth(),
                "active_sequences": executor.active_sequences(),
                "kv_slots": executor.kv_slots(),
                "kv_tokens": executor.kv_tokens(),
                "kv_bytes": executor.kv_bytes(),
                "kv_budget_bytes": executor.kv_pool().budget_bytes(),
                "steps": executor.steps(),
                "swaps": executor.swaps(),
                "current_checkpoint": executor.current().map(|id| id.to_string()),
            },
            "queues": queues,
            "memory": registry.memory(),
            "device": registry.backend().name(),
        })
    }

    fn load(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        if let Some(repository) = &self.repository {
            if let Some(problem) = repository.refresh(self.engine.registry(), model, version) {
                return Err(AdminError {
                    kind: AdminErrorKind::Invalid,
                    message: format!("cannot load {model}@{version}: {problem}; nothing changed"),
                });
            }
        }
        let report = self
            .engine
            .registry()
            .load(model, version)
            .map_err(admin_error)?;
        // A gated model's new version is measured now, so that activating
        // it compares stored figures; a failure here only shows in the reply.
        let gate = self.repository.as_ref().and_then(|r| {
            let gate = quality_gate::gate_of(r.root(), model).transpose()?;
            Some(
                gate.and_then(|g| {
                    quality_gate::measure(&self.engine, r.root(), &g, model, version)
                })
                .map_or_else(|e| json!({ "error": e.message }), |s| json!(s)),
            )
        });
        Ok(json!({
            "model": model,
            "version": version,
            "quality_gate": gate,
            "already_resident": report.already_resident,
            "load_ms": report.elapsed.as_secs_f64() * 1e3,
            "bytes": report.bytes,
            "shared_bytes": report.shared_bytes,
            "evicted": report.evicted.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }))
    }

    fn unload(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        let draining = self
            .engine
            .registry()
            .unload(model, version)
            .map_err(admin_error)?;
        Ok(json!({ "model": model, "version": version, "draining_requests": draining }))
    }

    fn activate(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        self.activate_with(model, version, false)
    }

    fn activate_with(&self, model: &str, version: &str, force: bool) -> Result<Value, AdminError> {
        let gate = match &self.repository {
            Some(repository) => quality_gate::check_activation(
                &self.engine,
                repository.root(),
                model,
                version,
                force,
            )?,
            None => None,
        };
        let previous = self
            .engine
            .registry()
            .activate(model, version)
            .map_err(admin_error)?;
        Ok(json!({
            "model": model,
            "active_version": version,
            "previous_version": previous,
            "quality_gate": gate,
        }))
    }

    fn adapters(&self) -> Value {
        adapter_admin::list(&self.engine)
    }

    fn register_adapter(&self, request: AdapterRequest) -> Result<Value, AdminError> {
        adapter_admin::register(&self.engine, request)
    }

    fn unregister_adapter(&self, name: &str) -> Result<Value, AdminError> {
        adapter_admin::unregister(&self.engine, name)
    }

    fn rollback(&self, model: &str) -> Result<Value, AdminError> {
        let (from, to) = self
            .engine
            .registry()
            .rollback(model)
            .map_err(admin_error)?;
        Ok(json!({ "model": model, "active_version": to, "rolled_back_from": from }))
    }
}

/// Stored measurements of every model in the repository at `root`, by model name.
fn quality_json(root: &std::path::Path) -> Value {
    let Ok(repository) = switchyard_engine::repository::ModelRepository::open(root) else {
        return Value::Null;
    };
    let models: serde_json::Map<String, Value> = repository
        .models
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                Value::from(crate::cli::quality::model_quality(root, m)),
            )
        })
        .collect();
    Value::Object(models)
}
