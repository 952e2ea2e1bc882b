//! The admin API's LoRA adapter calls over the engine's registry: list
//! (with the budget), register at run time, forget.

use serde_json::{json, Value};
use switchyard_engine::registry::AdapterRegistration;
use switchyard_engine::Engine;
use switchyard_kernels::Backend;
use switchyard_router::admin::{AdapterRequest, AdminError};

use super::admin_error::admin_error;

/// `GET /admin/adapters`.
pub fn list<B: Backend>(engine: &Engine<B>) -> Value {
    json!(engine.registry().adapter_usage())
}

/// `POST /admin/adapters`: the adapter is loaded and checked against its
/// base before it is served; a refusal names the file and the reason.
pub fn register<B: Backend>(
    engine: &Engine<B>,
    request: AdapterRequest,
) -> Result<Value, AdminError> {
    let registration = AdapterRegistration {
        name: request.name,
        version: request.version,
        base: request.base,
        path: request.path.into(),
        activate: request.activate,
    };
    let report = engine
        .registry()
        .add_adapter(&registration)
        .map_err(admin_error)?;
    let usage = engine.registry().adapter_usage();
    let bytes = usage
        .adapters
        .iter()
        .find(|a| a.name == registration.name && a.version == registration.version)
        .map_or(0, |a| a.bytes);
    Ok(json!({
        "name": registration.name,
        "version": registration.version,
        "base": registration.base,
        "path": registration.path.display().to_string(),
        "active": registration.activate,
        "adapter_bytes": bytes,
        "load_ms": report.elapsed.as_secs_f64() * 1e3,
        "evicted": report.evicted.iter().map(ToString::to_string).collect::<Vec<_>>(),
    }))
}

/// `DELETE /admin/adapters/{name}`.
pub fn unregister<B: Backend>(engine: &Engine<B>, name: &str) -> Result<Value, AdminError> {
    let draining = engine
        .registry()
        .remove_adapter(name)
        .map_err(admin_error)?;
    Ok(json!({ "name": name, "removed": true, "draining_requests": draining }))
}
