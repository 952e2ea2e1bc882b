//! `switchyard models REPO`: the models and versions of a model repository
//! as a table (or JSON), and what in it could not be used.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use serde_json::{json, Value};
use switchyard_engine::formats::CheckpointFormat;
use switchyard_engine::repository::{ModelRepository, RepoModel, RepoVersion};

#[derive(clap::Args, Debug)]
#[command(after_help = "STATUS shows what is on disk only: a running server's \
                        `GET /admin/models` shows which versions are loaded and where they reside.")]
pub struct ModelsArgs {
    /// The model repository: REPO/<model>/<version>/ holding a .gguf file or
    /// a Hugging Face folder, with an optional REPO/<model>/model.toml.
    pub repo: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let repo = ModelRepository::open(&args.repo)
        .with_context(|| format!("cannot open the model repository {}", args.repo.display()))?;
    let text = if args.json {
        serde_json::to_string_pretty(&repository_json(&repo))? + "\n"
    } else {
        repository_table(&repo)
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // `switchyard models REPO | head` closing the pipe early is fine.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.context("cannot write to stdout")?,
    }
    // Scripts check the repository with the exit status: a skipped model
    // is one `switchyard serve --repo` refuses to start with.
    if !repo.problems.is_empty() {
        anyhow::bail!(
            "{} problem(s) in {} (listed above); `switchyard serve --repo` does not start \
             with them unless given --allow-partial-start",
            repo.problems.len(),
            args.repo.display()
        );
    }
    Ok(())
}

const HEADERS: [&str; 11] = [
    "MODEL", "ALIASES", "VERSION", "FORMAT", "ARCH", "QUANT", "PARAMS", "SIZE", "SERVED",
    "DEFAULT", "STATUS",
];

/// The table, one row per version, then the problems.
pub fn repository_table(repo: &ModelRepository) -> String {
    let mut rows: Vec<[String; 11]> = vec![HEADERS.map(String::from)];
    for model in &repo.models {
        let default = model.default_version().map(|v| v.version.as_str());
        for (i, v) in model.versions.iter().enumerate() {
            // Name and aliases once per model keep the table readable.
            let (name, aliases) = if i == 0 {
                let aliases = if model.aliases.is_empty() {
                    "-".to_string()
                } else {
                    model.aliases.join(",")
                };
                (model.name.clone(), aliases)
            } else {
                (String::new(), String::new())
            };
            rows.push([
                name,
                aliases,
                v.version.clone(),
                format_name(v.format).into(),
                v.architecture.clone(),
                v.quant_mix.clone(),
                human_count(v.parameters),
                human_bytes(v.bytes),
                yes_no(model.serves(&v.version)).into(),
                if default == Some(v.version.as_str()) {
                    "*"
                } else {
                    ""
                }
                .into(),
                "on disk".into(),
            ]);
        }
    }
    let mut widths = [0usize; 11];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if repo.models.is_empty() {
        out.push_str(&format!("(no usable models in {})\n", repo.root.display()));
    }
    out.push_str(&super::quality::quality_lines(repo));
    if !repo.problems.is_empty() {
        out.push_str(&format!("\n{} problem(s), skipped:\n", repo.problems.len()));
        for p in &repo.problems {
            out.push_str(&format!("  {p}\n"));
        }
    }
    out
}

/// The repository as JSON: models with their versions, and problems.
pub fn repository_json(repo: &ModelRepository) -> Value {
    json!({
        "root": repo.root.display().to_string(),
        "models": repo.models.iter().map(|m| model_json(&repo.root, m)).collect::<Vec<_>>(),
        "problems": repo.problems.iter().map(|p| json!({
            "path": p.path.display().to_string(),
            "reason": p.reason,
        })).collect::<Vec<_>>(),
    })
}

fn model_json(root: &std::path::Path, model: &RepoModel) -> Value {
    let default = model.default_version().map(|v| v.version.clone());
    json!({
        "name": model.name,
        "aliases": model.aliases,
        "policy": model.policy.to_string(),
        "default_version": default,
        "versions": model.versions.iter().map(|v| version_json(model, v)).collect::<Vec<_>>(),
        "quality": super::quality::model_quality(root, model),
    })
}

fn version_json(model: &RepoModel, v: &RepoVersion) -> Value {
    json!({
        "version": v.version,
        "path": v.path.display().to_string(),
        "format": format_name(v.format),
        "architecture": v.architecture,
        "family": v.architecture,
        "quant_mix": v.quant_mix,
        "parameters": v.parameters,
        "bytes": v.bytes,
        "served": model.serves(&v.version),
        "status": "on disk",
    })
}

fn format_name(format: CheckpointFormat) -> &'static str {
    match format {
        CheckpointFormat::Gguf => "gguf",
        CheckpointFormat::Safetensors => "safetensors",
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// Bytes in decimal units: `98.4 MB`.
pub fn human_bytes(bytes: u64) -> String {
    scaled(bytes, &["B", "kB", "MB", "GB", "TB"], " ")
}

/// A count in decimal units: `134.5M`.
pub fn human_count(n: u64) -> String {
    scaled(n, &["", "k", "M", "G", "T"], "")
}

fn scaled(n: u64, units: &[&str], sep: &str) -> String {
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    let name = units.get(unit).copied().unwrap_or("");
    if unit == 0 {
        format!("{n}{sep}{name}").trim_end().to_string()
    } else {
        format!("{value:.1}{sep}{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(98_362_432), "98.4 MB");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_count(134_515_008), "134.5M");
        assert_eq!(human_count(12), "12");
    }
}
