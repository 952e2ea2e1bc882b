//! Where `switchyard serve` keeps budget spend and usage records: `--ledger` picks the
//! store (see `docs/SCALE-OUT.md` for which to use when), `--state-dir` where the
//! embedded one lives.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use switchyard_policies::ledger::{
    EmbeddedLedger, Ledger, MemoryLedger, RedisLedger, RedisOptions,
};

/// Environment variable naming the state directory when `--state-dir` is not given.
pub const STATE_DIR_ENV: &str = "SWITCHYARD_STATE_DIR";

/// Spend ledger flags of `switchyard serve`.
#[derive(clap::Args, Debug, Default)]
pub struct LedgerFlags {
    /// Where budget spend and usage records are kept: `embedded` (the default: a
    /// crash-safe file under --state-dir, for one instance), `memory` (forgotten on
    /// restart) or `redis://HOST:PORT[/DB]` (shared by every instance).
    #[arg(long, value_name = "STORE")]
    pub ledger: Option<String>,
    /// Directory of the embedded ledger [default: $SWITCHYARD_STATE_DIR, else
    /// $XDG_STATE_HOME/switchyard, else ~/.local/state/switchyard, else
    /// ./switchyard-state]. One instance per directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// With a Redis ledger: while Redis is unreachable, serve requests that need a
    /// budget without holding it (default: refuse them with 503 and Retry-After).
    #[arg(long)]
    pub ledger_fail_open: bool,
}

impl LedgerFlags {
    /// Opens the store the flags name.
    pub fn open(&self) -> anyhow::Result<Arc<dyn Ledger>> {
        let store = self.ledger.as_deref().unwrap_or("embedded").trim();
        if store.starts_with("redis://") {
            let mut options = RedisOptions::new(store);
            options.fail_open = self.ledger_fail_open;
            let ledger = RedisLedger::new(options).map_err(anyhow::Error::msg)?;
            crate::cli::console::info(&format!(
                "switchyard: spend ledger in Redis at {store} ({})",
                if self.ledger_fail_open {
                    "fail open"
                } else {
                    "fail closed"
                }
            ));
            return Ok(Arc::new(ledger));
        }
        if self.ledger_fail_open {
            anyhow::bail!(
                "--ledger-fail-open applies to a Redis ledger only (--ledger redis://HOST:PORT)"
            );
        }
        match store {
            "memory" => {
                crate::cli::console::info("switchyard: spend ledger in memory (forgotten on restart)");
                Ok(Arc::new(MemoryLedger::new()))
            }
            "embedded" => {
                let dir = self.state_dir.clone().unwrap_or_else(default_state_dir);
                let ledger = EmbeddedLedger::open(&dir)
                    .with_context(|| "cannot open the spend ledger (--state-dir)")?;
                crate::cli::console::info(&format!("switchyard: spend ledger in {}", ledger.path().display()));
                Ok(Arc::new(ledger))
            }
            other => anyhow::bail!(
                "--ledger `{other}` is not a ledger store; use embedded, memory or redis://HOST:PORT[/DB]"
            ),
        }
    }
}

/// `$SWITCHYARD_STATE_DIR`, else `$XDG_STATE_HOME/switchyard`, else
/// `~/.local/state/switchyard`, else `./switchyard-state`.
fn default_state_dir() -> PathBuf {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var(STATE_DIR_ENV) {
        return dir;
    }
    if let Some(dir) = var("XDG_STATE_HOME") {
        return dir.join("switchyard");
    }
    if let Some(home) = var("HOME") {
        return home.join(".local/state/switchyard");
    }
    PathBuf::from("switchyard-state")
}
