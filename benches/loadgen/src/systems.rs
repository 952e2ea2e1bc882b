//! The ways of serving K checkpoints that the suite compares, each started
//! behind one URL: Switchyard's one engine with all K, dedicated replicas
//! behind the by-model proxy, and one process restarted on switch.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use crate::process::{Server, ServerSpec};
use crate::proxy::{self, Backends, RestartStats, Restarter};

/// A server program and how to ask it for models.
#[derive(Clone, Debug)]
pub enum Engine {
    /// `switchyard serve` (or anything with its flags: `loadgen fake-server`),
    /// after `prefix` (`["serve"]`).
    Switchyard {
        program: PathBuf,
        prefix: Vec<String>,
    },
    /// llama.cpp's `llama-server`: one model per process.
    LlamaServer { program: PathBuf },
}

impl Engine {
    pub fn label(&self) -> &'static str {
        match self {
            Engine::Switchyard { .. } => "switchyard",
            Engine::LlamaServer { .. } => "llama-server",
        }
    }

    /// One process serving `models` (llama-server takes one only).
    fn spec(
        &self,
        models: &[(String, PathBuf)],
        port: u16,
        settings: &Settings,
        log_name: &str,
    ) -> ServerSpec {
        let threads = settings.threads.to_string();
        let (program, args) = match self {
            Engine::Switchyard { program, prefix } => {
                let mut args = prefix.clone();
                args.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
                args.extend(["--threads".into(), threads]);
                for (name, path) in models {
                    args.extend(["--model".into(), path.display().to_string()]);
                    args.extend(["--model-name".into(), name.clone()]);
                }
                (program.clone(), args)
            }
            Engine::LlamaServer { program } => {
                let (name, path) = &models[0];
                // Slots and context as Switchyard's defaults allow: 64
                // sequences of 512 tokens (prompt plus output fit in 300).
                let slots = settings.llama_slots;
                let args = [
                    "-m",
                    &path.display().to_string(),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "-t",
                    &threads,
                    "-np",
                    &slots.to_string(),
                    "-c",
                    &(slots * 512).to_string(),
                    "--alias",
                    name,
                ]
                .map(str::to_owned)
                .to_vec();
                (program.clone(), args)
            }
        };
        ServerSpec {
            program,
            args,
            port,
            log: settings.logs.join(format!("{log_name}.log")),
        }
    }
}

/// What every system gets alike.
pub struct Settings {
    pub threads: usize,
    pub llama_slots: usize,
    pub logs: PathBuf,
    pub next_port: AtomicU16,
}

impl Settings {
    /// A port no earlier server of this run used (so none is in TIME_WAIT)
    /// and nothing listens on now: another process's `/health` must not
    /// pass for the server's.
    fn port(&self) -> u16 {
        loop {
            let port = self.next_port.fetch_add(1, Ordering::Relaxed);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
}

/// How the K checkpoints are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    OneEngine,
    Replicas,
    Restart,
}

impl Layout {
    pub fn label(self) -> &'static str {
        match self {
            Layout::OneEngine => "one engine",
            Layout::Replicas => "replicas",
            Layout::Restart => "restart on switch",
        }
    }
}

/// A started system.
pub struct Running {
    pub url: String,
    /// The one engine's own URL, for its `/metrics`.
    pub metrics_url: Option<String>,
    servers: Vec<Server>,
    restarter: Option<Arc<Restarter>>,
    proxy: Option<tokio::task::JoinHandle<()>>,
}

/// What a system cost when it stopped.
pub struct Stopped {
    /// Summed over processes alive together (replicas); the largest one for
    /// restart on switch (one process at a time).
    pub peak_rss: u64,
    pub restarts: Option<RestartStats>,
}

pub async fn start(
    engine: &Engine,
    layout: Layout,
    models: &[(String, PathBuf)],
    settings: &Settings,
) -> anyhow::Result<Running> {
    let tag = format!(
        "{}-{}-k{}",
        engine.label(),
        layout.label().replace(' ', "-"),
        models.len()
    );
    match layout {
        Layout::OneEngine => {
            let server =
                Server::start(&engine.spec(models, settings.port(), settings, &tag)).await?;
            let url = server.spec.url();
            Ok(Running {
                metrics_url: Some(url.clone()),
                url,
                servers: vec![server],
                restarter: None,
                proxy: None,
            })
        }
        Layout::Replicas => {
            let mut servers = Vec::new();
            let mut urls = HashMap::new();
            for (i, model) in models.iter().enumerate() {
                let spec = engine.spec(
                    std::slice::from_ref(model),
                    settings.port(),
                    settings,
                    &format!("{tag}-{i}"),
                );
                let server = Server::start(&spec).await?;
                urls.insert(model.0.clone(), server.spec.url());
                servers.push(server);
            }
            let (address, task) = proxy::spawn(Arc::new(Backends::Replicas(urls))).await?;
            Ok(Running {
                url: format!("http://{address}"),
                metrics_url: None,
                servers,
                restarter: None,
                proxy: Some(task),
            })
        }
        Layout::Restart => {
            // One port for every restart, as llama-swap runs its upstream.
            let port = settings.port();
            let specs = models
                .iter()
                .map(|model| {
                    let spec = engine.spec(std::slice::from_ref(model), port, settings, &tag);
                    (model.0.clone(), spec)
                })
                .collect();
            let restarter = Restarter::new(specs);
            let (address, task) =
                proxy::spawn(Arc::new(Backends::Restart(restarter.clone()))).await?;
            Ok(Running {
                url: format!("http://{address}"),
                metrics_url: None,
                servers: Vec::new(),
                restarter: Some(restarter),
                proxy: Some(task),
            })
        }
    }
}

impl Running {
    pub async fn stop(self) -> Stopped {
        let mut peak_rss = self.servers.iter().filter_map(Server::peak_rss).sum();
        let mut restarts = None;
        if let Some(restarter) = &self.restarter {
            let stats = restarter.finish().await;
            peak_rss = stats.peak_rss;
            restarts = Some(stats);
        }
        for server in self.servers {
            server.stop().await;
        }
        if let Some(proxy) = self.proxy {
            proxy.abort();
        }
        Stopped { peak_rss, restarts }
    }
}
