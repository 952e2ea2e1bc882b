//! `REPO/<model>/model.toml`: aliases, the default version and the version
//! policy of one model, parsed strictly (unknown keys are errors).

use std::path::Path;

use serde::Deserialize;

/// Which versions on disk a model serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionPolicy {
    /// The `n` highest versions (the default is `Latest(1)`).
    Latest(usize),
    /// Every version on disk.
    All,
    /// Exactly these versions.
    Specific(Vec<String>),
}

impl Default for VersionPolicy {
    fn default() -> Self {
        VersionPolicy::Latest(1)
    }
}

impl std::fmt::Display for VersionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VersionPolicy::Latest(n) => write!(f, "latest {n}"),
            VersionPolicy::All => f.write_str("all"),
            VersionPolicy::Specific(versions) => write!(f, "versions {}", versions.join(", ")),
        }
    }
}

/// The parsed contents of a `model.toml`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelToml {
    pub aliases: Vec<String>,
    pub default_version: Option<String>,
    pub policy: VersionPolicy,
    /// The chat template: a known template's name, or a Jinja file (relative
    /// paths from the model's folder).
    pub chat_template: Option<String>,
    /// The context window, at most the trained context.
    pub ctx_size: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelToml {
    #[serde(default)]
    aliases: Vec<String>,
    default_version: Option<String>,
    version_policy: Option<RawPolicy>,
    chat_template: Option<String>,
    ctx_size: Option<usize>,
    /// Read by `eval::gate`, its one home; accepted here so the file parses.
    #[allow(dead_code)]
    quality_gate: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    latest: Option<usize>,
    all: Option<bool>,
    versions: Option<Vec<String>>,
}

/// Parses the text of `path`; the error names the file, line and column.
pub fn parse_model_toml(text: &str, path: &Path) -> Result<ModelToml, String> {
    let raw: RawModelToml = toml::from_str(text).map_err(|e| {
        let place = e
            .span()
            .map(|span| {
                let (line, column) = line_column(text, span.start);
                format!("line {line}, column {column}: ")
            })
            .unwrap_or_default();
        format!(
            "{} is not a valid model.toml: {place}{}; the keys are aliases, default_version, \
             chat_template, ctx_size, [version_policy] with one of latest, all or versions, \
             and [quality_gate]",
            path.display(),
            e.message().trim_end()
        )
    })?;
    let policy = match raw.version_policy {
        None => VersionPolicy::default(),
        Some(p) => policy_from(p)
            .map_err(|reason| format!("{}: [version_policy] {reason}", path.display()))?,
    };
    Ok(ModelToml {
        aliases: raw.aliases,
        default_version: raw.default_version,
        policy,
        chat_template: raw.chat_template,
        ctx_size: raw.ctx_size,
    })
}

fn policy_from(raw: RawPolicy) -> Result<VersionPolicy, String> {
    match (raw.latest, raw.all, raw.versions) {
        (Some(0), None, None) => Err("latest = 0 serves nothing; use latest = 1 or more".into()),
        (Some(n), None, None) => Ok(VersionPolicy::Latest(n)),
        (None, Some(true), None) => Ok(VersionPolicy::All),
        (None, Some(false), None) => {
            Err("all = false says nothing; use latest = N or versions = [...] instead".into())
        }
        (None, None, Some(v)) if v.is_empty() => {
            Err("versions = [] serves nothing; list at least one version".into())
        }
        (None, None, Some(v)) => Ok(VersionPolicy::Specific(v)),
        (None, None, None) => Err("is empty; set one of latest, all or versions".into()),
        _ => Err("sets more than one of latest, all and versions; keep exactly one".into()),
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ModelToml, String> {
        parse_model_toml(text, Path::new("m/model.toml"))
    }

    #[test]
    fn full_file_parses() {
        let t = parse(
            "aliases = [\"small\", \"chat\"]\ndefault_version = \"2\"\nchat_template = \"gemma\"\n[version_policy]\nlatest = 2\n",
        )
        .unwrap();
        assert_eq!(t.chat_template.as_deref(), Some("gemma"));
        assert_eq!(t.aliases, vec!["small", "chat"]);
        assert_eq!(t.default_version.as_deref(), Some("2"));
        assert_eq!(t.policy, VersionPolicy::Latest(2));
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(parse("").unwrap(), ModelToml::default());
    }

    #[test]
    fn policies_parse() {
        let all = parse("[version_policy]\nall = true\n").unwrap();
        assert_eq!(all.policy, VersionPolicy::All);
        let list = parse("[version_policy]\nversions = [\"1\", \"3\"]\n").unwrap();
        assert_eq!(
            list.policy,
            VersionPolicy::Specific(vec!["1".into(), "3".into()])
        );
    }

    #[test]
    fn unknown_key_names_file_line_and_column() {
        let err = parse("aliases = []\ndefualt_version = \"1\"\n").unwrap_err();
        assert!(err.contains("m/model.toml"), "{err}");
        assert!(err.contains("line 2, column 1"), "{err}");
        assert!(err.contains("defualt_version"), "{err}");
    }

    #[test]
    fn conflicting_or_empty_policies_are_refused() {
        for text in [
            "[version_policy]\nlatest = 1\nall = true\n",
            "[version_policy]\n",
            "[version_policy]\nlatest = 0\n",
            "[version_policy]\nversions = []\n",
            "[version_policy]\nall = false\n",
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains("[version_policy]"), "{text}: {err}");
        }
    }

    #[test]
    fn wrong_type_is_refused() {
        let err = parse("default_version = 2\n").unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }
}
