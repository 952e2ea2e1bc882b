//! `switchyard calibrate`: sets a cascade's `min_confidence` from measured answers.
//!
//! The answers come from a running server, asked as the cascade's clients will ask
//! (`--base`: the first model named, greedy, with log-probabilities; `--strong` asks the
//! next model too), or from a file of answers measured before (`--answers`). Each
//! answer's confidence is the engine's own [`TokenConfidence`], as the server sends it
//! (`x-switchyard-confidence`), or its summary of the returned log-probabilities; the
//! threshold is chosen by `switchyard_policies::calibrate`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use switchyard_engine::eval::normalize::matches;
use switchyard_engine::eval::{wilson95, Suite, Task};
use switchyard_policies::calibrate::{calibrate, values, Answer, Calibration, Goal};
use switchyard_policies::{Policy, Statistic, HEADER_CONFIDENCE};
use switchyard_seam::TokenConfidence;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    switchyard calibrate --base http://127.0.0.1:8080 --model smollm2 --suite evals/geo-gen.jsonl --target 0.8 --policy policy.toml\n  \
    switchyard calibrate --base http://127.0.0.1:8080 --model smollm2 --strong gemma --suite evals/geo-gen.jsonl --of-strong 0.95\n  \
    switchyard calibrate --answers answers.jsonl --statistic p25 --of-strong 0.95 --json\n\
    See docs/EVALS.md (Calibrating min_confidence).")]
pub struct CalibrateArgs {
    /// A running server to ask, e.g. http://127.0.0.1:8080.
    #[arg(long, required_unless_present = "answers", conflicts_with = "answers")]
    pub base: Option<String>,
    /// The cascade's first model, as a request names it (with --base).
    #[arg(long, required_unless_present = "answers")]
    pub model: Option<String>,
    /// A generation suite (JSONL, `{"prompt", "answer"}` lines; with --base).
    #[arg(long, required_unless_present = "answers")]
    pub suite: Option<PathBuf>,
    /// The cascade's next model: asked the same items, for --of-strong.
    #[arg(long, requires = "base")]
    pub strong: Option<String>,
    /// Answers measured before instead of a server: JSONL of `{"correct": bool,
    /// "confidence": "<x-switchyard-confidence>", "strong_correct": bool}` (`logprobs`:
    /// [...] instead of `confidence` for the log-probability statistics; the last optional).
    #[arg(long)]
    pub answers: Option<PathBuf>,
    /// The answers kept must be right at least this share of the time (0..1).
    #[arg(
        long,
        required_unless_present = "of_strong",
        conflicts_with = "of_strong"
    )]
    pub target: Option<f64>,
    /// The cascade must be right at least this share as often as the next model alone
    /// (0..1; needs --strong or `strong_correct` in --answers).
    #[arg(long)]
    pub of_strong: Option<f64>,
    /// The statistic the cascade compares: mean, min, p05, p10, p25, p50, margin,
    /// neg_entropy or min_margin (margin and neg_entropy: the first token's, the cascade
    /// then stops the first model after it).
    #[arg(long, default_value = "p10")]
    pub statistic: String,
    /// The first N items of the suite only.
    #[arg(long)]
    pub count: Option<usize>,
    /// As the cascade's requests will ask: the confidence covers every generated token.
    #[arg(long, default_value_t = 8)]
    pub max_tokens: u32,
    /// Stop sequences, as the cascade's requests will send them (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Send each prompt as a chat message (default: a completion of the prompt as is).
    #[arg(long)]
    pub chat: bool,
    /// Fewest kept answers a --target threshold may rest on.
    #[arg(long, default_value_t = 5)]
    pub min_kept: usize,
    /// A tenant's API key, when the policy needs one.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Write `confidence` and `min_confidence` into this policy file's `[cascade]`
    /// (a server watching it picks them up without a restart).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Print one JSON object: the calibration and every answer's statistic.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    let statistic = Statistic::parse(&args.statistic).with_context(|| {
        format!(
            "--statistic {}: not one of {}",
            args.statistic,
            Statistic::NAMES.join(", ")
        )
    })?;
    let goal = match (args.target, args.of_strong) {
        (Some(accuracy), None) if accuracy > 0.0 && accuracy <= 1.0 => Goal::Kept { accuracy },
        (None, Some(fraction)) if fraction > 0.0 && fraction <= 1.0 => Goal::OfStrong { fraction },
        _ => bail!("give one of --target or --of-strong, a share in (0, 1]"),
    };
    let answers = match &args.answers {
        Some(path) => read_answers(path)?,
        None => ask_server(&args)?,
    };
    let unmeasured = |a: &Answer| {
        a.confidence
            .is_some_and(|c| c.first.is_none() || c.min_margin.is_none())
    };
    if matches!(statistic, Statistic::First(_) | Statistic::MinMargin)
        && answers.iter().any(unmeasured)
    {
        bail!(
            "--statistic {statistic} needs the engine's margins: ask a server that sends {HEADER_CONFIDENCE} (one serving a --policy), or give `confidence` (its text) on every line of --answers"
        );
    }
    if matches!(goal, Goal::OfStrong { .. }) && answers.iter().any(|a| a.strong_correct.is_none()) {
        bail!("--of-strong needs the next model's answers: --strong NAME, or `strong_correct` on every line of --answers");
    }
    let result = calibrate(&answers, statistic, goal, args.min_kept);
    if args.json {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{}",
            report_json(&args, &answers, statistic, goal, result.as_ref())?
        )?;
    }
    let Some(result) = result else {
        let right = answers.iter().filter(|a| a.correct).count();
        bail!(
            "no {statistic} threshold meets the goal ({}) over {} answers (the first model is right on {right})",
            goal_text(goal),
            answers.len()
        );
    };
    if !args.json {
        println!("{}", summary(&result));
    }
    if let Some(path) = &args.policy {
        write_policy(path, statistic, result.min_confidence)?;
        eprintln!(
            "set {statistic} min_confidence = {} in {}",
            result.min_confidence,
            path.display()
        );
    }
    Ok(())
}

fn goal_text(goal: Goal) -> String {
    match goal {
        Goal::Kept { accuracy } => format!("kept answers right >= {accuracy}"),
        Goal::OfStrong { fraction } => format!("cascade right >= {fraction} x the next model"),
    }
}

fn summary(c: &Calibration) -> String {
    let (lo, hi) = wilson95(c.kept_correct, c.kept);
    let kept_acc = c.kept_correct as f64 / c.kept.max(1) as f64;
    let mut text = format!(
        "{} min_confidence = {}: keeps {} of {} answers (defers {:.0}%), kept accuracy {kept_acc:.3} [{lo:.3}, {hi:.3}] against {:.3} for all",
        c.statistic,
        c.min_confidence,
        c.kept,
        c.n,
        c.deferred_share * 100.0,
        c.first_accuracy
    );
    if let (Some(cascade), Some(strong)) = (c.cascade_accuracy, c.strong_accuracy) {
        text += &format!(
            "; cascade accuracy {cascade:.3} against {strong:.3} for the next model alone"
        );
    }
    text
}

fn report_json(
    args: &CalibrateArgs,
    answers: &[Answer],
    statistic: Statistic,
    goal: Goal,
    result: Option<&Calibration>,
) -> anyhow::Result<Value> {
    let mut value = match result {
        Some(c) => {
            let mut v = serde_json::to_value(c)?;
            let (lo, hi) = wilson95(c.kept_correct, c.kept);
            v["kept_ci95"] = json!([lo, hi]);
            v
        }
        None => json!({"statistic": statistic, "min_confidence": null, "n": answers.len()}),
    };
    value["goal"] = serde_json::to_value(goal)?;
    value["model"] = json!(args.model);
    value["strong"] = json!(args.strong);
    value["suite"] = json!(args.suite.as_ref().map(|p| p.display().to_string()));
    let confidences = values(answers, statistic);
    value["items"] = answers
        .iter()
        .zip(confidences)
        .map(|(a, c)| {
            json!({
                "correct": a.correct,
                "strong_correct": a.strong_correct,
                // JSON has no infinity: an answer without tokens shows null.
                "confidence": c.is_finite().then_some(c),
            })
        })
        .collect();
    Ok(value)
}

/// Asks the server for the first (and the next) model's answer to every generation item.
fn ask_server(args: &CalibrateArgs) -> anyhow::Result<Vec<Answer>> {
    let (Some(base), Some(model), Some(suite_path)) = (&args.base, &args.model, &args.suite) else {
        bail!("--base needs --model and --suite");
    };
    let suite = Suite::load(suite_path)?;
    let items: Vec<(&str, &str)> = suite
        .items
        .iter()
        .filter_map(|item| match &item.task {
            Task::Generate { prompt, answer } => Some((prompt.as_str(), answer.as_str())),
            Task::Choice { .. } => None,
        })
        .take(args.count.unwrap_or(usize::MAX))
        .collect();
    if items.is_empty() {
        bail!(
            "{}: no generation items ({{\"prompt\", \"answer\"}} lines) to calibrate on",
            suite_path.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::new();
    runtime.block_on(async {
        let mut answers = Vec::with_capacity(items.len());
        for (prompt, expected) in items {
            let (text, confidence) = ask(&client, args, base, model, prompt).await?;
            let strong_correct = match &args.strong {
                Some(strong) => {
                    let (text, _) = ask(&client, args, base, strong, prompt).await?;
                    Some(matches(&text, expected))
                }
                None => None,
            };
            answers.push(Answer {
                correct: matches(&text, expected),
                confidence,
                strong_correct,
            });
        }
        Ok::<_, anyhow::Error>(answers)
    })
}

/// One greedy answer: its text and the engine's confidence in it: the server's
/// `x-switchyard-confidence` (every statistic, margins included), else the summary of the
/// log-probabilities it returned (a server without a policy sends no such header).
async fn ask(
    client: &reqwest::Client,
    args: &CalibrateArgs,
    base: &str,
    model: &str,
    prompt: &str,
) -> anyhow::Result<(String, Option<TokenConfidence>)> {
    let mut body = json!({"model": model, "max_tokens": args.max_tokens, "temperature": 0});
    if !args.stop.is_empty() {
        body["stop"] = json!(args.stop);
    }
    let path = if args.chat {
        body["messages"] = json!([{"role": "user", "content": prompt}]);
        body["logprobs"] = json!(true);
        "/v1/chat/completions"
    } else {
        body["prompt"] = json!(prompt);
        body["logprobs"] = json!(1);
        "/v1/completions"
    };
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut request = client.post(&url).json(&body);
    if let Some(key) = &args.api_key {
        request = request.bearer_auth(key);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    let header = response
        .headers()
        .get(HEADER_CONFIDENCE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let reply: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered {status} with no JSON"))?;
    if !status.is_success() {
        bail!("{url} answered {status}: {reply}");
    }
    let choice = &reply["choices"][0];
    let numbers = |v: &Value| -> Vec<f32> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_f64)
                    .map(|x| x as f32)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (text, mut logprobs) = if args.chat {
        let content = choice["message"]["content"].as_str().unwrap_or_default();
        let logprobs: Vec<f32> = choice["logprobs"]["content"]
            .as_array()
            .map(|tokens| {
                tokens
                    .iter()
                    .filter_map(|t| t["logprob"].as_f64())
                    .map(|x| x as f32)
                    .collect()
            })
            .unwrap_or_default();
        (content.to_string(), logprobs)
    } else {
        let text = choice["text"].as_str().unwrap_or_default();
        (
            text.to_string(),
            numbers(&choice["logprobs"]["token_logprobs"]),
        )
    };
    let confidence = match header {
        Some(header) => Some(
            header
                .parse::<TokenConfidence>()
                .with_context(|| format!("{url} sent a bad {HEADER_CONFIDENCE}"))?,
        ),
        None => TokenConfidence::of(&mut logprobs, &[]),
    };
    Ok((text, confidence))
}

fn read_answers(path: &Path) -> anyhow::Result<Vec<Answer>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut answers = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let value: Value =
            serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let Some(correct) = value["correct"].as_bool() else {
            bail!("{}: `correct` must be true or false", at());
        };
        let confidence = match &value["confidence"] {
            // The server's `x-switchyard-confidence`, as it sent it: every statistic.
            Value::String(text) => Some(
                text.parse::<TokenConfidence>()
                    .with_context(|| format!("{}: `confidence`", at()))?,
            ),
            Value::Null => {
                let Some(logprobs) = value["logprobs"].as_array() else {
                    bail!(
                        "{}: give `confidence` (the server's {HEADER_CONFIDENCE}) or `logprobs` (a list of numbers)",
                        at()
                    );
                };
                let mut logprobs = logprobs
                    .iter()
                    .map(|x| x.as_f64().map(|x| x as f32))
                    .collect::<Option<Vec<f32>>>()
                    .with_context(|| format!("{}: `logprobs` must be a list of numbers", at()))?;
                TokenConfidence::of(&mut logprobs, &[])
            }
            _ => bail!(
                "{}: `confidence` must be the text of {HEADER_CONFIDENCE}",
                at()
            ),
        };
        let strong_correct = match &value["strong_correct"] {
            Value::Null => None,
            Value::Bool(b) => Some(*b),
            _ => bail!("{}: `strong_correct` must be true or false", at()),
        };
        answers.push(Answer {
            correct,
            confidence,
            strong_correct,
        });
    }
    if answers.is_empty() {
        bail!("{}: no answers", path.display());
    }
    Ok(answers)
}

/// Sets `confidence` and `min_confidence` in the `[cascade]` table of the policy file at
/// `path`, refusing to write a file that would not load.
fn write_policy(path: &Path, statistic: Statistic, threshold: f64) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let Some(edited) = set_cascade_threshold(&text, statistic, threshold) else {
        bail!(
            "{}: no [cascade] table to set min_confidence in",
            path.display()
        );
    };
    let source = path.display().to_string();
    Policy::from_toml_str_with_env(&edited, &source, &|var| std::env::var(var).ok()).with_context(
        || format!("{source} would not load with the threshold set; left as it was"),
    )?;
    // Written whole and renamed, so a server watching the file never reads half of it.
    let tmp = path.with_extension("toml.calibrating");
    std::fs::write(&tmp, edited).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
}

/// `text` with the `[cascade]` table's `confidence` and `min_confidence` replaced (the
/// rest of the file as it was), or `None` without such a table.
fn set_cascade_threshold(text: &str, statistic: Statistic, threshold: f64) -> Option<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let header = lines.iter().position(|l| {
        let l = l.trim();
        l == "[cascade]"
            || (l.starts_with("[cascade]") && l["[cascade]".len()..].trim_start().starts_with('#'))
    })?;
    let mut out = String::with_capacity(text.len() + 64);
    for line in lines.iter().take(header + 1) {
        out.push_str(line);
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out += &format!("confidence = \"{statistic}\"\nmin_confidence = {threshold:?}\n");
    let mut in_table = true;
    for line in lines.iter().skip(header + 1) {
        let trimmed = line.trim_start();
        in_table &= !trimmed.starts_with('[');
        let key = trimmed.split('=').next().unwrap_or("").trim();
        if in_table && trimmed.contains('=') && (key == "confidence" || key == "min_confidence") {
            continue;
        }
        out.push_str(line);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_replaces_the_cascades_own_keys_only() {
        let text = "[routing]\nconfidence_note = 1\n\n[cascade] # cheap first\nmodels = [\"a\", \"b\"]\nmin_confidence = -1.5\nconfidence = \"mean\"\n\n[[models]]\nname = \"a\"\n";
        let p10 = Statistic::parse("p10").unwrap();
        let out = set_cascade_threshold(text, p10, -0.85).unwrap();
        assert_eq!(
            out,
            "[routing]\nconfidence_note = 1\n\n[cascade] # cheap first\nconfidence = \"p10\"\nmin_confidence = -0.85\nmodels = [\"a\", \"b\"]\n\n[[models]]\nname = \"a\"\n"
        );
        assert_eq!(set_cascade_threshold("[routing]\n", p10, -1.0), None);
        // Whole numbers stay floats in TOML.
        let out = set_cascade_threshold("[cascade]", p10, -2.0).unwrap();
        assert_eq!(
            out,
            "[cascade]\nconfidence = \"p10\"\nmin_confidence = -2.0\n"
        );
    }
}
