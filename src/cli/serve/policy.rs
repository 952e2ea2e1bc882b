//! `switchyard serve` with a routing policy and an admin API.
//!
//! `--policy FILE` routes every inference request through the policy (see
//! `policies/README.md`); the file is watched (checked once a second) and hot-reloaded,
//! and a broken edit keeps the old policy and logs the error with its line and column.
//! The admin API listens on `--admin-listen` (default 127.0.0.1:8081, loopback so it is
//! never exposed by accident) only when an admin token is set with `--admin-token` or
//! `SWITCHYARD_ADMIN_TOKEN`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use switchyard_policies::{PolicyStore, PolicyWatcher};
use switchyard_router::admin::{admin_app, AdminState, ModelAdmin};
use switchyard_router::policy::PolicyRouting;
use switchyard_router::{
    app_with_policy, serve_with_drain_deadline, shutdown_signal, AppState, Router,
};
use switchyard_seam::InferenceBackend;

/// Environment variable holding the admin token when `--admin-token` is not given.
pub const ADMIN_TOKEN_ENV: &str = "SWITCHYARD_ADMIN_TOKEN";

/// The shortest admin token accepted.
const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// How often the policy file is checked for edits.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Routing policy and admin API flags of `switchyard serve`.
#[derive(clap::Args, Debug, Default)]
pub struct PolicyFlags {
    /// A routing policy file (TOML): tenants, budgets, splits, fallbacks. Watched and
    /// hot-reloaded; check it first with `switchyard policy check FILE`.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Address of the admin API [default: 127.0.0.1:8081]. It listens only when an
    /// admin token is set.
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// Bearer token of the admin API [default: $SWITCHYARD_ADMIN_TOKEN]. Without one the
    /// admin API is off. Prefer the environment: flags show up in process listings.
    #[arg(long, value_name = "TOKEN")]
    pub admin_token: Option<String>,
    /// Where budget spend is kept.
    #[command(flatten)]
    pub ledger: super::ledger::LedgerFlags,
}

/// The policy store (with its file watcher) and the admin settings of one server.
pub struct PolicySetup {
    store: Option<Arc<PolicyStore>>,
    // Dropping the watcher stops it, so it lives as long as the setup.
    _watcher: Option<PolicyWatcher>,
    admin: Option<(SocketAddr, String)>,
}

impl PolicySetup {
    /// Loads the policy (every problem reported as FILE:LINE:COLUMN) and starts watching it.
    pub fn load(flags: &PolicyFlags) -> anyhow::Result<PolicySetup> {
        let (store, watcher) = match &flags.policy {
            Some(path) => {
                let ledger = flags.ledger.open()?;
                let store = Arc::new(PolicyStore::open_with_ledger(path, ledger)?);
                let watcher = store
                    .watch(WATCH_INTERVAL)
                    .with_context(|| format!("cannot watch the policy file {}", path.display()))?;
                crate::cli::console::info(&format!(
                    "switchyard: routing with policy {} ({} models, {} tenants, {} splits)",
                    path.display(),
                    store.current().models().len(),
                    store.current().tenants().len(),
                    store.current().splits().len()
                ));
                (Some(store), Some(watcher))
            }
            None => (None, None),
        };
        // Surrounding spaces (a quoted value, a newline from a file) could never be
        // presented in a header, so the token is trimmed; a short one is refused.
        let token = flags
            .admin_token
            .clone()
            .or_else(|| std::env::var(ADMIN_TOKEN_ENV).ok())
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        if let Some(token) = &token {
            let length = token.chars().count();
            if length < MIN_ADMIN_TOKEN_CHARS {
                anyhow::bail!(
                    "the admin token has {length} characters; use at least {MIN_ADMIN_TOKEN_CHARS} \
                     (for example `openssl rand -hex 16`)"
                );
            }
        }
        let admin = token.map(|token| {
            let listen = flags
                .admin_listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8081)));
            (listen, token)
        });
        if admin.is_none() {
            crate::cli::console::warn(&format!(
                "switchyard: admin API off (no admin token); set {ADMIN_TOKEN_ENV} or pass \
                 --admin-token (16 characters or more) to turn it on"
            ));
        }
        if admin.is_none() && flags.admin_listen.is_some() {
            anyhow::bail!(
                "--admin-listen is set but no admin token is: pass --admin-token or set {ADMIN_TOKEN_ENV}"
            );
        }
        Ok(PolicySetup {
            store,
            _watcher: watcher,
            admin,
        })
    }

    /// The policy store, when serving with a policy.
    pub fn store(&self) -> Option<&Arc<PolicyStore>> {
        self.store.as_ref()
    }

    /// The HTTP app, routing inference requests through the policy when there is one.
    pub fn app(&self, state: AppState, backend: Arc<dyn InferenceBackend>) -> Router {
        let routing = self
            .store
            .as_ref()
            .map(|store| Arc::new(PolicyRouting::over_backend(Arc::clone(store), backend)));
        app_with_policy(state, routing)
    }

    /// Starts the admin API when a token is set; it stops with the server (SIGTERM or
    /// SIGINT), draining for at most `drain`. `models` is the engine's model lifecycle
    /// adapter (`None`: the model endpoints answer 404).
    pub async fn spawn_admin(
        &self,
        models: Option<Arc<dyn ModelAdmin>>,
        drain: Duration,
    ) -> anyhow::Result<Option<tokio::task::JoinHandle<std::io::Result<()>>>> {
        let Some((listen, token)) = &self.admin else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} for the admin API"))?;
        let address = listener.local_addr().unwrap_or(*listen);
        crate::cli::console::info(&format!("switchyard: admin API on http://{address}/admin"));
        let state = AdminState::new(token.clone(), self.store.clone(), models);
        Ok(Some(tokio::spawn(serve_with_drain_deadline(
            listener,
            admin_app(state),
            shutdown_signal(),
            drain,
        ))))
    }
}
