//! What startup found wrong with its configuration, said once and whole.
//!
//! A `model.toml` typo, a `--model` path that does not load, a policy that
//! does not parse or names checkpoints nobody serves: each is collected here
//! instead of being warned about and skipped, so the operator sees every
//! problem in one list and the server does not start half-configured by
//! accident. `--allow-partial-start` starts anyway when something can be
//! served; `/ready` and the console then say what is missing.

use std::fmt::Write as _;
use std::path::Path;

use switchyard_engine::registry::ModelStatus;
use switchyard_policies::Policy;

/// Every problem startup found.
#[derive(Debug, Default)]
pub struct StartupProblems {
    items: Vec<String>,
    /// A problem `--allow-partial-start` cannot start past (a policy that
    /// does not load: serving without it would drop its tenants' keys).
    fatal: bool,
}

impl StartupProblems {
    /// A problem the server can start without, under `--allow-partial-start`.
    pub fn push(&mut self, problem: impl Into<String>) {
        let problem = problem.into();
        if !self.items.contains(&problem) {
            self.items.push(problem);
        }
    }

    /// A problem no server may start with.
    pub fn push_fatal(&mut self, problem: impl Into<String>) {
        self.fatal = true;
        self.push(problem);
    }

    /// Whether nothing can be served at all (fatal from then on).
    pub fn nothing_to_serve(&mut self) {
        self.push_fatal("no model could be loaded, so there is nothing to serve");
    }

    /// `Ok` with what is missing (said on the console, listed by `/ready`)
    /// when the server may start; else the error listing every problem.
    pub fn finish(self, allow_partial: bool) -> anyhow::Result<Vec<String>> {
        if self.items.is_empty() {
            return Ok(Vec::new());
        }
        if allow_partial && !self.fatal {
            let mut text = format!(
                "switchyard: warning: starting without what these {} problem(s) cost \
                 (--allow-partial-start); GET /ready lists them:",
                self.items.len()
            );
            for item in &self.items {
                let _ = write!(text, "\n  - {item}");
            }
            crate::cli::console::warn(&text);
            return Ok(self.items);
        }
        let mut text = format!(
            "the server did not start: {} problem(s) in its configuration",
            self.items.len()
        );
        for (i, item) in self.items.iter().enumerate() {
            let _ = write!(text, "\n  {}. {item}", i + 1);
        }
        if !self.fatal {
            text.push_str(
                "\nfix them and start again, or pass --allow-partial-start to serve what loaded",
            );
        }
        Err(anyhow::Error::msg(text))
    }
}

/// The policy's checkpoints (`name@version`) that no served model answers to,
/// each a problem naming the policy's file and line and the served names.
pub fn policy_names_not_served(
    policy: &Policy,
    path: &Path,
    served: &[ModelStatus],
) -> Vec<String> {
    let source = std::fs::read_to_string(path).unwrap_or_default();
    let serves = |name: &str, version: &str| {
        served.iter().any(|m| {
            (m.name == name || m.aliases.iter().any(|a| a == name))
                && m.versions.iter().any(|v| v.version == version)
        })
    };
    let served_list = served
        .iter()
        .flat_map(|m| {
            m.versions
                .iter()
                .map(move |v| format!("{}@{}", m.name, v.version))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut problems = Vec::new();
    for model in policy.models() {
        for version in &model.versions {
            if serves(&model.name, version) {
                continue;
            }
            let place = line_of_name(&source, &model.name).map_or_else(
                || path.display().to_string(),
                |line| format!("{}:{line}", path.display()),
            );
            problems.push(format!(
                "{place}: the policy's model `{name}` version `{version}` (`{name}@{version}`) is \
                 not served; this server serves {served_list}. Name the policy's [[models]] after \
                 them (`--model FILE --model-name NAME` serves version `1` as `NAME@1`)",
                name = model.name,
            ));
        }
    }
    problems
}

/// The line (1-based) of `name = "NAME"` in a policy's text.
fn line_of_name(source: &str, name: &str) -> Option<usize> {
    let quoted = format!("\"{name}\"");
    source
        .lines()
        .position(|line| {
            let line = line.trim_start();
            line.starts_with("name") && line.contains(&quoted)
        })
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_problem_is_listed_once_and_partial_start_keeps_them() {
        let mut problems = StartupProblems::default();
        problems.push("first problem");
        problems.push("second problem");
        problems.push("first problem");
        let err = problems.finish(false).unwrap_err().to_string();
        assert_eq!(err.matches("first problem").count(), 1, "{err}");
        assert!(
            err.contains("2 problem(s)") && err.contains("--allow-partial-start"),
            "{err}"
        );

        let mut problems = StartupProblems::default();
        problems.push("first problem");
        assert_eq!(
            problems.finish(true).unwrap(),
            vec!["first problem".to_string()]
        );

        let mut problems = StartupProblems::default();
        problems.push_fatal("policy");
        assert!(problems.finish(true).is_err());
    }

    #[test]
    fn the_policy_line_is_found() {
        let text = "[routing]\n\n[[models]]\nname = \"smol\"\nversion = \"1\"\n";
        assert_eq!(line_of_name(text, "smol"), Some(4));
        assert_eq!(line_of_name(text, "other"), None);
    }
}
