//! Server processes under test: start one, wait until it answers `/health`,
//! read its peak resident memory, stop it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::process::{Child, Command};

/// How to start one server that listens on `port`.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub port: u16,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl ServerSpec {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// A started server; dropping it kills the process.
pub struct Server {
    pub spec: ServerSpec,
    child: Child,
}

/// How long a server may take to load its model and answer `/health`.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

impl Server {
    pub async fn start(spec: &ServerSpec) -> anyhow::Result<Server> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .with_context(|| format!("cannot open {}", spec.log.display()))?;
        let child = Command::new(&spec.program)
            .args(&spec.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", spec.program.display()))?;
        let mut server = Server {
            spec: spec.clone(),
            child,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    /// Polls `/health` until it answers 200 (llama-server answers 503 while
    /// it loads), failing early if the process exits.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let url = format!("{}/health", self.spec.url());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before it was ready; see {}",
                    self.spec.program.display(),
                    self.spec.log.display()
                );
            }
            if let Ok(response) = http.get(&url).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            if start.elapsed() > READY_TIMEOUT {
                bail!(
                    "{} not ready after {READY_TIMEOUT:?}",
                    self.spec.program.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The process's peak resident set (VmHWM), in bytes.
    pub fn peak_rss(&self) -> Option<u64> {
        self.pid().and_then(peak_rss_of)
    }

    /// Kills the process and waits for it, so that its port and memory are
    /// free when this returns.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// VmHWM of a process from /proc (Linux), in bytes.
pub fn peak_rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_peak_resident_set() {
        let bytes = peak_rss_of(std::process::id()).unwrap_or(0);
        assert!(bytes > 1 << 20, "VmHWM {bytes}");
    }
}
