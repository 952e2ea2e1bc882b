//! What the admin API asks of the engine for model lifecycle: the [`ModelAdmin`] trait
//! the engine adapter implements, and how its operations fail.

/// Model lifecycle operations the admin API exposes; implemented by the engine adapter.
/// Calls may block (loads take seconds): the admin handlers run them in spawn_blocking.
pub trait ModelAdmin: Send + Sync + 'static {
    fn models(&self) -> serde_json::Value; // GET  /admin/models
    fn status(&self) -> serde_json::Value; // GET  /admin/status
    fn load(&self, model: &str, version: &str) -> Result<serde_json::Value, AdminError>; // POST /admin/models/{model}/versions/{version}/load
    fn unload(&self, model: &str, version: &str) -> Result<serde_json::Value, AdminError>; // POST .../unload
    fn activate(&self, model: &str, version: &str) -> Result<serde_json::Value, AdminError>; // POST .../activate
    /// `activate`, with `force` (`?force=true`) overriding a quality gate's refusal.
    fn activate_with(
        &self,
        model: &str,
        version: &str,
        force: bool,
    ) -> Result<serde_json::Value, AdminError> {
        let _ = force;
        self.activate(model, version)
    }
    fn rollback(&self, model: &str) -> Result<serde_json::Value, AdminError>; // POST /admin/models/{model}/rollback
    /// `GET /admin/cache`: the prompt cache's use per cache scope (`{"scopes": [...]}`).
    fn cache(&self) -> serde_json::Value {
        serde_json::json!({"scopes": []})
    }
    /// `GET /admin/adapters`: the LoRA adapters, resident or not, against their budget.
    fn adapters(&self) -> serde_json::Value {
        serde_json::json!({"adapters": []})
    }
    /// `POST /admin/adapters`: registers, loads and activates an adapter over a base.
    fn register_adapter(&self, adapter: AdapterRequest) -> Result<serde_json::Value, AdminError> {
        Err(no_adapters(&adapter.name))
    }
    /// `DELETE /admin/adapters/{name}`: forgets an adapter and all its versions.
    fn unregister_adapter(&self, name: &str) -> Result<serde_json::Value, AdminError> {
        Err(no_adapters(name))
    }
}

/// `POST /admin/adapters`'s body, each field checked (see `admin::adapters`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterRequest {
    /// The name requests give in `model`.
    pub name: String,
    /// The served base model it was trained for.
    pub base: String,
    /// A PEFT folder or a GGUF adapter file, on the server.
    pub path: String,
    /// Default `"1"`.
    pub version: String,
    /// Whether requests for `name` get this version at once (default true).
    pub activate: bool,
}

fn no_adapters(name: &str) -> AdminError {
    AdminError {
        kind: AdminErrorKind::NotFound,
        message: format!("this server does not serve LoRA adapters, so `{name}` cannot be changed"),
    }
}

/// Why a model operation failed; `message` says what and what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct AdminError {
    /// The class of failure (decides the HTTP status).
    pub kind: AdminErrorKind,
    /// What went wrong and what to do.
    pub message: String,
}

/// Classes of model operation failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminErrorKind {
    /// No such model or version (404).
    NotFound, /*404*/
    /// The operation conflicts with the current state, e.g. unloading the active version (409).
    Conflict, /*409*/
    /// Corrupt or mismatched checkpoint (422).
    Invalid, /*422: corrupt or mismatched checkpoint*/
    /// The engine cannot do it now, e.g. out of memory (503).
    Unavailable, /*503*/
}
