//! `switchyard serve` settings: a TOML file, overridden by flags.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! threads = 2
//! max_batch = 64
//! max_queue = 256
//! max_step_tokens = 256
//! ram_budget_mb = 2048      # resident tensors, shared ones counted once
//! lora_budget_mb = 64       # resident LoRA adapters; LRU idle ones evicted past it
//! # repo = "/models"        # a model repository instead of [[models]]
//!
//! [[models]]
//! path = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
//! name = "smollm2"          # optional: the file stem by default
//! version = "1"             # optional: "1" by default
//! chat_template = "gemma"   # optional: a known name, a Jinja file or "auto"
//! ctx_size = 4096           # optional: the context window (default: the trained one)
//! draft = "/models/small.gguf" # optional: a draft model of the same tokenizer
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;
use switchyard_engine::chat_choice::TemplateSpec;
use switchyard_engine::serving::{AdapterSource, CheckpointOptions};

use crate::cli::device::Device;

/// The settings file's contents; every field optional.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    pub listen: Option<SocketAddr>,
    pub threads: Option<usize>,
    /// Where the kernels run (`cpu`).
    #[serde(default, deserialize_with = "device")]
    pub device: Option<Device>,
    /// `f16`, `f32` or `q8_0`.
    #[serde(default, deserialize_with = "kv_type")]
    pub kv_type: Option<switchyard_kernels::KvType>,
    /// `f32`, `bf16`, `bf16-prompt` or `bf16x3` (see `--attention-precision`).
    #[serde(default, deserialize_with = "attention_precision")]
    pub attention_precision: Option<switchyard_kernels::AttentionPrecision>,
    /// Positions per KV block (a multiple of 32).
    pub kv_block: Option<usize>,
    /// MiB all KV caches may reserve together.
    pub kv_budget_mb: Option<u64>,
    pub max_batch: Option<usize>,
    pub max_queue: Option<usize>,
    pub max_step_tokens: Option<usize>,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    pub drain_seconds: Option<u64>,
    /// RAM for resident checkpoint tensors, in MiB.
    pub ram_budget_mb: Option<u64>,
    /// MiB for resident LoRA adapters (see `--lora-budget-mb`).
    pub lora_budget_mb: Option<u64>,
    /// A model repository folder to serve instead of `[[models]]`.
    pub repo: Option<PathBuf>,
    #[serde(default)]
    pub models: Vec<ModelEntry>,
}

fn kv_type<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<switchyard_kernels::KvType>, D::Error> {
    parsed(d)
}

fn attention_precision<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<switchyard_kernels::AttentionPrecision>, D::Error> {
    parsed(d)
}

fn device<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Device>, D::Error> {
    parsed(d)
}

/// An optional name parsed with its `FromStr`, whose error names what is known.
fn parsed<'de, D: serde::Deserializer<'de>, T: std::str::FromStr<Err = String>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    let name: Option<String> = Option::deserialize(d)?;
    name.map(|n| n.parse().map_err(serde::de::Error::custom))
        .transpose()
}

/// One model to serve.
#[derive(Debug, Deserialize, PartialEq, Clone)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// A GGUF file or a Hugging Face folder.
    pub path: PathBuf,
    /// The name clients use; the file stem when absent.
    pub name: Option<String>,
    /// Its version ("1" when absent); several entries with one name and
    /// different versions are versions of one model, the last one active.
    pub version: Option<String>,
    /// A known chat template's name, a Jinja file or `auto` (the default).
    pub chat_template: Option<String>,
    /// The context window, at most the trained context (the default).
    pub ctx_size: Option<usize>,
    /// A LoRA adapter served under this entry's name over `path` (a PEFT
    /// folder or a GGUF adapter); `parent` names the base model it is for.
    pub adapter: Option<PathBuf>,
    pub parent: Option<String>,
    /// A smaller model of the same tokenizer that drafts tokens for this
    /// one (speculative decoding).
    pub draft: Option<PathBuf>,
}

impl ModelEntry {
    /// How the engine serves it.
    pub fn options(&self) -> CheckpointOptions {
        CheckpointOptions {
            chat_template: self
                .chat_template
                .as_ref()
                .filter(|value| !value.eq_ignore_ascii_case("auto"))
                .map(|value| TemplateSpec::new(value, "--chat-template")),
            ctx_size: self.ctx_size,
            adapter: self.adapter.as_ref().map(|path| AdapterSource {
                path: path.clone(),
                parent: self
                    .parent
                    .clone()
                    .unwrap_or_else(|| default_name(&self.path)),
            }),
            draft: self.draft.clone(),
        }
    }

    /// An adapter entry from `--lora NAME=PATH` or `NAME=BASE:PATH`, over
    /// the model of `models` named BASE (or the only one).
    pub fn lora(spec: &str, models: &[ModelEntry]) -> anyhow::Result<ModelEntry> {
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--lora {spec:?}: give NAME=PATH or NAME=BASE:PATH"))?;
        let named = rest.split_once(':').and_then(|(base, path)| {
            models
                .iter()
                .find(|m| m.adapter.is_none() && m.served_name() == base)
                .map(|m| (m, path))
        });
        let (base, path) = match named {
            Some(found) => found,
            None => {
                let bases: Vec<&ModelEntry> =
                    models.iter().filter(|m| m.adapter.is_none()).collect();
                let [only] = bases.as_slice() else {
                    anyhow::bail!(
                        "--lora {spec:?}: {} models are served; name the base as NAME=BASE:PATH \
                         (BASE one of: {})",
                        bases.len(),
                        bases
                            .iter()
                            .map(|m| m.served_name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                };
                (*only, rest)
            }
        };
        anyhow::ensure!(
            !name.is_empty() && !path.is_empty(),
            "--lora {spec:?}: give NAME=PATH or NAME=BASE:PATH"
        );
        Ok(ModelEntry {
            path: base.path.clone(),
            name: Some(name.to_owned()),
            version: None,
            chat_template: base.chat_template.clone(),
            ctx_size: base.ctx_size,
            adapter: Some(PathBuf::from(path)),
            parent: Some(base.served_name()),
            draft: None,
        })
    }

    /// The name clients use for this model.
    pub fn served_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| default_name(&self.path))
    }
}

/// `SmolLM2-135M-Instruct.Q4_1` for `.../SmolLM2-135M-Instruct.Q4_1.gguf`;
/// a folder's own name for a Hugging Face folder.
pub fn default_name(path: &Path) -> String {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

impl ServeFile {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> anyhow::Result<ServeFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the settings file {}", path.display()))?;
        toml::from_str(&text).with_context(|| {
            format!(
                "the settings file {} is not valid (see `switchyard serve --help` for its keys)",
                path.display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_refuses_unknown_ones() {
        let file: ServeFile = toml::from_str(
            r#"
            listen = "0.0.0.0:9000"
            threads = 3
            max_batch = 8
            max_queue = 32
            max_step_tokens = 128
            drain_seconds = 5
            [[models]]
            path = "/m/a.gguf"
            [[models]]
            path = "/m/b.gguf"
            name = "bee"
            "#,
        )
        .unwrap();
        assert_eq!(file.listen, Some("0.0.0.0:9000".parse().unwrap()));
        assert_eq!(file.threads, Some(3));
        assert_eq!(file.models.len(), 2);
        assert_eq!(file.models[0].served_name(), "a");
        assert_eq!(file.models[1].served_name(), "bee");
        assert!(toml::from_str::<ServeFile>("listen_addr = \"x\"").is_err());
    }

    #[test]
    fn default_name_is_the_file_stem() {
        assert_eq!(
            default_name(Path::new("/x/SmolLM2-135M-Instruct.Q4_1.gguf")),
            "SmolLM2-135M-Instruct.Q4_1"
        );
    }

    #[test]
    fn lora_specs_name_their_base_or_take_the_only_one() {
        let file: ServeFile = toml::from_str(
            r#"
            [[models]]
            path = "/m/a.gguf"
            [[models]]
            path = "/m/b.gguf"
            name = "bee"
            "#,
        )
        .unwrap();
        let models = file.models;
        let over_bee = ModelEntry::lora("pirate=bee:/l/p", &models).unwrap();
        assert_eq!(over_bee.path, Path::new("/m/b.gguf"));
        assert_eq!(over_bee.served_name(), "pirate");
        let options = over_bee.options();
        let source = options.adapter.unwrap();
        assert_eq!(source.path, Path::new("/l/p"));
        assert_eq!(source.parent, "bee");
        // Two bases and none named: refused, listing them.
        let err = ModelEntry::lora("pirate=/l/p", &models)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a, bee"), "{err}");
        assert!(ModelEntry::lora("no-equals", &models).is_err());
        // One base: a path with a colon that names no model is a path.
        let one = &models[..1];
        let entry = ModelEntry::lora("x=/l/c:d", one).unwrap();
        assert_eq!(entry.adapter.as_deref(), Some(Path::new("/l/c:d")));
        assert_eq!(entry.parent.as_deref(), Some("a"));
    }
}
