//! Walking `REPO/<model>/<version>/`: every model folder, its `model.toml`
//! and its versions, recording what cannot be used instead of failing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::adapters::{adapter_path, RepoAdapter, RepoAdapterVersion, ADAPTERS_DIR};
use super::inspect::{compare_versions, inspect_version};
use super::model_toml::{parse_model_toml, ModelToml, VersionPolicy};
use super::{RepoModel, RepositoryError, RepositoryProblem};
use crate::chat_choice::{known_template_names, TemplateSpec};

/// The models of the repository at `root`, sorted by name, and the problems
/// met on the way.
pub(super) fn scan(
    root: &Path,
) -> Result<(Vec<RepoModel>, Vec<RepositoryProblem>), RepositoryError> {
    let unreadable = |source| RepositoryError::RootUnreadable {
        path: root.to_path_buf(),
        source,
    };
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(root).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        // Files beside the models (a README) and hidden folders are not models.
        if path.is_dir() && !is_hidden(&path) {
            dirs.push(path);
        }
    }
    dirs.sort();
    let mut problems = Vec::new();
    let mut models = Vec::new();
    // Symlinks inside the repository are followed only while they stay inside it: a
    // link to /etc or to a device must not become a served "checkpoint".
    let inside = Containment::new(root);
    for dir in dirs {
        if let Some(reason) = inside.escapes(&dir) {
            problems.push(RepositoryProblem::new(&dir, reason));
            continue;
        }
        if let Some(model) = scan_model(&dir, &inside, &mut problems) {
            models.push(model);
        }
    }
    resolve_alias_clashes(&mut models, root, &mut problems);
    drop_adapter_name_clashes(&mut models, root, &mut problems);
    Ok((models, problems))
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// Whether `name` may name a model, an alias or a version.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

const NAME_RULE: &str = "use only letters, digits, '.', '_' and '-'";

/// The repository's real location, to tell paths that resolve inside it from those
/// that a symlink takes elsewhere.
struct Containment {
    root: Option<PathBuf>,
}

impl Containment {
    fn new(root: &Path) -> Self {
        Containment {
            root: std::fs::canonicalize(root).ok(),
        }
    }

    /// Why `path` cannot be used (it resolves outside the repository, or not at all);
    /// `None` when it stays inside.
    fn escapes(&self, path: &Path) -> Option<String> {
        let root = self.root.as_ref()?;
        match std::fs::canonicalize(path) {
            Ok(real) if real.starts_with(root) => None,
            Ok(real) => Some(format!(
                "is a symbolic link to {}, outside the repository; copy the checkpoint into \
                 the repository instead",
                real.display()
            )),
            Err(e) => Some(format!("cannot be resolved: {e}")),
        }
    }

    /// [`Containment::escapes`] for a version folder and every entry in it.
    fn version_escapes(&self, dir: &Path) -> Option<(PathBuf, String)> {
        if let Some(reason) = self.escapes(dir) {
            return Some((dir.to_path_buf(), reason));
        }
        let entries = std::fs::read_dir(dir).ok()?;
        entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .find_map(|path| self.escapes(&path).map(|reason| (path, reason)))
    }
}

/// `model.toml`'s `chat_template`: a known name as is, a relative file path
/// from the model's folder.
fn chat_template_spec(value: String, dir: &Path) -> TemplateSpec {
    let given_in = dir.join("model.toml").display().to_string();
    let is_name = known_template_names()
        .iter()
        .any(|name| name.eq_ignore_ascii_case(&value));
    if is_name || Path::new(&value).is_absolute() {
        return TemplateSpec::new(value, given_in);
    }
    TemplateSpec::new(dir.join(value).display().to_string(), given_in)
}

fn scan_model(
    dir: &Path,
    inside: &Containment,
    problems: &mut Vec<RepositoryProblem>,
) -> Option<RepoModel> {
    let name = dir.file_name()?.to_string_lossy().into_owned();
    if !valid_name(&name) {
        problems.push(RepositoryProblem::new(
            dir,
            format!("'{name}' is not a valid model name; rename the folder and {NAME_RULE}"),
        ));
        return None;
    }
    let config = read_model_toml(dir, problems)?;
    let versions = scan_versions(dir, inside, problems);
    if versions.is_empty() {
        problems.push(RepositoryProblem::new(
            dir,
            "has no usable version; add a folder such as 1/ holding a .gguf file or a Hugging \
             Face checkpoint",
        ));
        return None;
    }
    let mut model = RepoModel {
        name,
        aliases: Vec::new(),
        default_version: None,
        policy: config.policy,
        chat_template: config
            .chat_template
            .map(|value| chat_template_spec(value, dir)),
        ctx_size: config.ctx_size,
        versions,
        adapters: scan_adapters(&dir.join(ADAPTERS_DIR), inside, problems),
    };
    check_policy(&model, dir, problems);
    model.aliases = valid_aliases(config.aliases, &model.name, dir, problems);
    model.default_version = config
        .default_version
        .filter(|v| check_default_version(&model, v, dir, problems));
    Some(model)
}

/// The model's `model.toml`, defaults when absent; `None` (a problem
/// recorded) when it exists but is broken, so the model is skipped rather
/// than served with settings nobody asked for.
fn read_model_toml(dir: &Path, problems: &mut Vec<RepositoryProblem>) -> Option<ModelToml> {
    let path = dir.join("model.toml");
    if !path.exists() {
        return Some(ModelToml::default());
    }
    let parsed = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
        .and_then(|text| parse_model_toml(&text, &path));
    match parsed {
        Ok(config) => Some(config),
        Err(reason) => {
            problems.push(RepositoryProblem::new(path, reason));
            None
        }
    }
}

fn scan_versions(
    dir: &Path,
    inside: &Containment,
    problems: &mut Vec<RepositoryProblem>,
) -> Vec<super::RepoVersion> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            problems.push(RepositoryProblem::new(dir, format!("cannot list it: {e}")));
            return Vec::new();
        }
    };
    let mut version_dirs: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_dir() && !is_hidden(path))
        // The adapters' folder is not a version (see `adapters.rs`).
        .filter(|path| !path.ends_with(ADAPTERS_DIR))
        .collect();
    version_dirs.sort();
    let mut versions = Vec::new();
    for path in version_dirs {
        let Some(version) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !valid_name(&version) {
            problems.push(RepositoryProblem::new(
                &path,
                format!(
                    "'{version}' is not a valid version name; rename the folder and {NAME_RULE}"
                ),
            ));
            continue;
        }
        if let Some((at, reason)) = inside.version_escapes(&path) {
            problems.push(RepositoryProblem::new(&at, reason));
            continue;
        }
        match inspect_version(&path, &version) {
            Ok(v) => versions.push(v),
            Err(reason) => problems.push(RepositoryProblem::new(&path, reason)),
        }
    }
    versions.sort_by(|a, b| compare_versions(&a.version, &b.version));
    versions
}

/// Records versions a `versions = [...]` policy names that are not usable.
fn check_policy(model: &RepoModel, dir: &Path, problems: &mut Vec<RepositoryProblem>) {
    if let VersionPolicy::Specific(listed) = &model.policy {
        for v in listed {
            if model.version(v).is_none() {
                problems.push(RepositoryProblem::new(
                    dir.join("model.toml"),
                    format!(
                        "version_policy lists version '{v}', which is not a usable version of \
                         '{}' (usable: {})",
                        model.name,
                        model.version_list()
                    ),
                ));
            }
        }
    }
}

/// Whether `version` can be the default; records why not.
fn check_default_version(
    model: &RepoModel,
    version: &str,
    dir: &Path,
    problems: &mut Vec<RepositoryProblem>,
) -> bool {
    let reason = if model.version(version).is_none() {
        format!(
            "default_version '{version}' is not a usable version (usable: {})",
            model.version_list()
        )
    } else if !model.serves(version) {
        format!(
            "default_version '{version}' is not served by the version policy ({})",
            model.policy
        )
    } else {
        return true;
    };
    problems.push(RepositoryProblem::new(
        dir.join("model.toml"),
        format!("{reason}; the highest served version is the default instead"),
    ));
    false
}

fn valid_aliases(
    aliases: Vec<String>,
    name: &str,
    dir: &Path,
    problems: &mut Vec<RepositoryProblem>,
) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for alias in aliases {
        if !valid_name(&alias) {
            problems.push(RepositoryProblem::new(
                dir.join("model.toml"),
                format!("alias '{alias}' is not a valid name; {NAME_RULE}"),
            ));
        } else if alias != name && !kept.contains(&alias) {
            kept.push(alias);
        }
    }
    kept
}

/// Drops every alias that is another model's name or another model's alias
/// too: such a name is ambiguous, so neither model gets it by accident.
fn resolve_alias_clashes(
    models: &mut [RepoModel],
    root: &Path,
    problems: &mut Vec<RepositoryProblem>,
) {
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in models.iter() {
        for alias in &m.aliases {
            owners
                .entry(alias.clone())
                .or_default()
                .push(m.name.clone());
        }
    }
    let is_name = |n: &str| models.iter().any(|m| m.name == n);
    let mut dropped = Vec::new();
    for (alias, holders) in &owners {
        if is_name(alias) {
            for holder in holders {
                problems.push(RepositoryProblem::new(
                    root.join(holder).join("model.toml"),
                    format!(
                        "alias '{alias}' of model '{holder}' is the name of model '{alias}'; the \
                         alias is ignored, choose another"
                    ),
                ));
            }
            dropped.push(alias.clone());
        } else if holders.len() > 1 {
            problems.push(RepositoryProblem::new(
                root,
                format!(
                    "alias '{alias}' is claimed by models {}; it is ignored for all of them, \
                     keep it in one model.toml only",
                    holders.join(" and ")
                ),
            ));
            dropped.push(alias.clone());
        }
    }
    for m in models.iter_mut() {
        m.aliases.retain(|a| !dropped.contains(a));
    }
}

/// Subfolders of `dir`, sorted; hidden ones left out.
fn subfolders(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_dir() && !is_hidden(path))
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// The adapters under `REPO/<model>/adapters/` (none when it is absent).
fn scan_adapters(
    dir: &Path,
    inside: &Containment,
    problems: &mut Vec<RepositoryProblem>,
) -> Vec<RepoAdapter> {
    if !dir.is_dir() {
        return Vec::new();
    }
    let names = match subfolders(dir) {
        Ok(names) => names,
        Err(reason) => {
            problems.push(RepositoryProblem::new(dir, reason));
            return Vec::new();
        }
    };
    let mut adapters = Vec::new();
    for adapter_dir in names {
        let name = adapter_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !valid_name(&name) {
            problems.push(RepositoryProblem::new(
                &adapter_dir,
                format!("'{name}' is not a valid adapter name; rename the folder and {NAME_RULE}"),
            ));
            continue;
        }
        let mut versions = Vec::new();
        for path in subfolders(&adapter_dir).unwrap_or_default() {
            let version = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !valid_name(&version) {
                problems.push(RepositoryProblem::new(
                    &path,
                    format!("'{version}' is not a valid version name; rename the folder and {NAME_RULE}"),
                ));
                continue;
            }
            if let Some((at, reason)) = inside.version_escapes(&path) {
                problems.push(RepositoryProblem::new(&at, reason));
                continue;
            }
            match adapter_path(&path) {
                Ok(found) => versions.push(RepoAdapterVersion {
                    version,
                    path: found,
                }),
                Err(reason) => problems.push(RepositoryProblem::new(&path, reason)),
            }
        }
        if versions.is_empty() {
            problems.push(RepositoryProblem::new(
                &adapter_dir,
                "has no usable version; add a folder such as 1/ holding a PEFT adapter or a .gguf \
                 adapter",
            ));
            continue;
        }
        versions.sort_by(|a, b| compare_versions(&a.version, &b.version));
        adapters.push(RepoAdapter { name, versions });
    }
    adapters
}

/// Drops every adapter whose name is a model's name or alias, or another
/// model's adapter's: requests could not tell them apart.
fn drop_adapter_name_clashes(
    models: &mut [RepoModel],
    root: &Path,
    problems: &mut Vec<RepositoryProblem>,
) {
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in models.iter() {
        for a in &m.adapters {
            owners
                .entry(a.name.clone())
                .or_default()
                .push(m.name.clone());
        }
    }
    let taken = |n: &str| {
        models
            .iter()
            .any(|m| m.name == n || m.aliases.iter().any(|a| a == n))
    };
    let dropped: Vec<String> = owners
        .iter()
        .filter(|(name, holders)| taken(name) || holders.len() > 1)
        .map(|(name, holders)| {
            problems.push(RepositoryProblem::new(
                holders.first().map_or_else(
                    || root.to_path_buf(),
                    |h| root.join(h).join(ADAPTERS_DIR).join(name),
                ),
                format!(
                    "adapter '{name}' (of {}) has the name of a model, an alias or another \
                     model's adapter; it is not served, rename its folder",
                    holders.join(" and ")
                ),
            ));
            name.clone()
        })
        .collect();
    for m in models.iter_mut() {
        m.adapters.retain(|a| !dropped.contains(&a.name));
    }
}
