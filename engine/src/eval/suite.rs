//! Evaluation suites: JSONL files, one item a line.
//!
//! ```text
//! {"context": "2 + 2 =", "choices": [" 3", " 4", " 5"], "answer": 1}
//! {"prompt": "Q: 2 + 2 =\nA:", "answer": "4"}
//! ```
//!
//! A multiple-choice item is scored by the log-likelihood of each choice's
//! tokens appended to the context exactly as given (the data carries any
//! leading space in the choice, as in lm-evaluation-harness); a generation
//! item by exact match of the greedy answer (see [`super::normalize`]).
//! Blank lines and lines starting with `#` are skipped. Unknown keys are
//! refused, so a misspelt field cannot silently change what is scored.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::EvalError;

/// One item of a suite, with the line it came from (1-based).
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub line: usize,
    pub task: Task,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Task {
    /// Pick the likeliest of `choices` after `context`; `answer` indexes the right one.
    Choice {
        context: String,
        choices: Vec<String>,
        answer: usize,
    },
    /// Generate greedily after `prompt`; right when it matches `answer`.
    Generate { prompt: String, answer: String },
}

/// A parsed suite and the file it came from.
#[derive(Clone, Debug)]
pub struct Suite {
    pub path: PathBuf,
    pub items: Vec<Item>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawItem {
    Choice(RawChoice),
    Generate(RawGenerate),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChoice {
    context: String,
    choices: Vec<String>,
    answer: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGenerate {
    prompt: String,
    answer: String,
}

impl Suite {
    /// Reads and checks every line of the JSONL file at `path`.
    pub fn load(path: &Path) -> Result<Suite, EvalError> {
        let text = std::fs::read_to_string(path).map_err(|e| EvalError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Suite::parse(path, &text)
    }

    /// Parses suite `text`; `path` names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Suite, EvalError> {
        let mut items = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let bad = |reason: String| EvalError::Item {
                path: path.to_path_buf(),
                line,
                reason,
            };
            let task = parse_line(trimmed).map_err(bad)?;
            items.push(Item { line, task });
        }
        if items.is_empty() {
            return Err(EvalError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(Suite {
            path: path.to_path_buf(),
            items,
        })
    }

    /// The suite's name: its file name without `.jsonl`.
    pub fn name(&self) -> String {
        suite_name(&self.path)
    }
}

/// A suite's name from its path: the file stem (`evals/arith.jsonl` → `arith`).
pub fn suite_name(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

fn parse_line(line: &str) -> Result<Task, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    let object = value
        .as_object()
        .ok_or("an item must be a JSON object with \"context\", \"choices\" and \"answer\", or \"prompt\" and \"answer\"")?;
    // Name the field that is wrong rather than serde's untagged "did not match".
    let kind = if object.contains_key("choices") || object.contains_key("context") {
        "choice"
    } else if object.contains_key("prompt") {
        "generate"
    } else {
        return Err(
            "an item needs \"context\" and \"choices\" (multiple choice) or \"prompt\" (generation)"
                .into(),
        );
    };
    let raw = if kind == "choice" {
        serde_json::from_value::<RawChoice>(value).map(RawItem::Choice)
    } else {
        serde_json::from_value::<RawGenerate>(value).map(RawItem::Generate)
    }
    .map_err(|e| format!("bad {kind} item: {e}"))?;
    match raw {
        RawItem::Choice(c) => {
            if c.choices.len() < 2 {
                return Err(format!(
                    "\"choices\" needs at least 2 entries, got {}",
                    c.choices.len()
                ));
            }
            if let Some(i) = c.choices.iter().position(|s| s.is_empty()) {
                return Err(format!(
                    "\"choices\"[{i}] is empty; a choice needs text to score"
                ));
            }
            if c.answer >= c.choices.len() {
                return Err(format!(
                    "\"answer\" is {} but there are {} choices (0-based)",
                    c.answer,
                    c.choices.len()
                ));
            }
            Ok(Task::Choice {
                context: c.context,
                choices: c.choices,
                answer: c.answer,
            })
        }
        RawItem::Generate(g) => {
            if g.prompt.is_empty() {
                return Err("\"prompt\" is empty".into());
            }
            Ok(Task::Generate {
                prompt: g.prompt,
                answer: g.answer,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Suite, EvalError> {
        Suite::parse(Path::new("s.jsonl"), text)
    }

    #[test]
    fn reads_both_kinds_and_skips_blank_and_comment_lines() {
        let suite = parse(
            "# a comment\n{\"context\":\"a\",\"choices\":[\" b\",\" c\"],\"answer\":1}\n\n\
             {\"prompt\":\"p\",\"answer\":\"x\"}\n",
        )
        .unwrap();
        assert_eq!(suite.items.len(), 2);
        assert_eq!(suite.items[0].line, 2);
        assert_eq!(suite.items[1].line, 4);
        assert!(matches!(suite.items[1].task, Task::Generate { .. }));
        assert_eq!(suite.name(), "s");
    }

    #[test]
    fn errors_name_line_and_field() {
        let cases = [
            (
                "{\"context\":\"a\",\"choices\":[\" b\",\" c\"],\"answer\":2}",
                "\"answer\" is 2",
            ),
            (
                "{\"context\":\"a\",\"choices\":[\" b\"],\"answer\":0}",
                "at least 2",
            ),
            (
                "{\"context\":\"a\",\"choices\":[\" b\",\"\"],\"answer\":0}",
                "\"choices\"[1] is empty",
            ),
            (
                "{\"context\":\"a\",\"choice\":[\" b\"],\"answer\":0}",
                "unknown field `choice`",
            ),
            ("{\"prompt\":\"a\"}", "missing field `answer`"),
            ("[1]", "JSON object"),
            ("{\"x\":1}", "needs \"context\""),
            ("not json", "not valid JSON"),
        ];
        for (line, want) in cases {
            let error = parse(&format!("\n{line}\n")).unwrap_err().to_string();
            assert!(error.starts_with("s.jsonl:2: "), "{error}");
            assert!(error.contains(want), "{line}: {error}");
        }
        assert!(parse("\n# only a comment\n")
            .unwrap_err()
            .to_string()
            .contains("no items"));
    }
}
