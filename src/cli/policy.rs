//! `switchyard policy check FILE` and `switchyard policy explain FILE --request REQ.json`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;
use switchyard_engine::repository::ModelRepository;
use switchyard_policies::{
    estimate_tokens, explain, Caller, EngineView, Hints, IdleEngine, ModelHint, Policy,
    RouteRequest, StaticEngineView,
};

/// Arguments of `switchyard policy`.
#[derive(clap::Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(clap::Subcommand)]
enum PolicyCommand {
    /// Validate a policy file: print a summary, or every problem as FILE:LINE:COLUMN (exit 1).
    Check {
        /// The policy file (TOML).
        file: PathBuf,
    },
    /// Show how a request would be routed: every candidate's constraints, scores and the pick.
    Explain {
        /// The policy file (TOML).
        file: PathBuf,
        /// An OpenAI request body (chat or completions JSON).
        #[arg(long, value_name = "REQ.json")]
        request: PathBuf,
        /// A request header, `Name: value`: `authorization: Bearer KEY` or an
        /// `x-switchyard-*` hint. Repeatable.
        #[arg(long = "header", value_name = "K:V")]
        headers: Vec<String>,
        /// Route as this tenant without an API key.
        #[arg(long, conflicts_with = "headers")]
        tenant: Option<String>,
        /// Live engine state as JSON: `{"default": {...}, "checkpoints": {"model@version": {...}}}`.
        /// Without it every checkpoint counts as resident, idle and healthy.
        #[arg(long, value_name = "STATE.json")]
        engine_state: Option<PathBuf>,
        /// Print the explanation as JSON instead of text.
        #[arg(long)]
        json: bool,
        /// A model repository: `quality_from` figures are read from the
        /// measurements stored there (`switchyard eval --save`), and each
        /// policy model's measured quality is shown, with n and interval, or
        /// that it is missing or stale.
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
    },
}

/// Runs `switchyard policy`.
pub fn run(args: PolicyArgs) -> anyhow::Result<()> {
    match args.command {
        PolicyCommand::Check { file } => check(&file),
        PolicyCommand::Explain {
            file,
            request,
            headers,
            tenant,
            engine_state,
            json,
            repo,
        } => {
            let mut policy = Policy::load(&file)?;
            if let Some(dir) = &repo {
                policy = policy.resolve_quality(&super::quality::RepoQuality::new(dir));
            }
            let mut req = read_request(&request)?;
            if let Some(t) = tenant {
                req.caller = Caller::Tenant(t);
            }
            apply_headers(&mut req, &headers)?;
            let engine: Box<dyn EngineView> = match engine_state {
                Some(path) => Box::new(read_engine_state(&path)?),
                None => Box::new(IdleEngine),
            };
            let explanation = explain(&policy, &req, engine.as_ref());
            let measured = match &repo {
                Some(dir) => {
                    let repository = ModelRepository::open(dir).with_context(|| {
                        format!("cannot open the model repository {}", dir.display())
                    })?;
                    Some(super::quality::policy_measurements(&repository, &policy))
                }
                None => None,
            };
            match (json, measured) {
                (true, None) => println!("{}", serde_json::to_string_pretty(&explanation)?),
                (true, Some(measured)) => println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "explanation": explanation, "measured_quality": measured })
                    )?
                ),
                (false, measured) => {
                    println!("{explanation}");
                    if let Some(measured) = measured {
                        print!("{}", super::quality::policy_measurement_lines(&measured));
                    }
                }
            }
            // Scripts (and CI checks of a policy) read the verdict from the exit status.
            if explanation.pick.is_none() {
                anyhow::bail!("no candidate can be picked for this request (see above)");
            }
            Ok(())
        }
    }
}

fn check(file: &Path) -> anyhow::Result<()> {
    let policy = Policy::load(file)?;
    let checkpoints: usize = policy.models().iter().map(|m| m.versions.len()).sum();
    println!(
        "ok: {}: {} models ({checkpoints} checkpoints), {} tenants, {} splits, {} fallback lists",
        file.display(),
        policy.models().len(),
        policy.tenants().len(),
        policy.splits().len(),
        policy
            .models()
            .iter()
            .filter(|m| m.fallback.is_some())
            .count(),
    );
    for m in policy.models() {
        let active = m.versions.get(m.active_version).map_or("?", |v| &**v);
        let aliases: Vec<&str> = m.aliases.iter().map(|a| &**a).collect();
        println!(
            "  model {} (active {active}; versions {}; aliases [{}]; quality {}; cost {}/{} per 1k in/out; context {})",
            m.name,
            m.versions.iter().map(|v| &**v).collect::<Vec<_>>().join(", "),
            aliases.join(", "),
            m.quality,
            m.cost_per_1k_input,
            m.cost_per_1k_output,
            m.context_limit
        );
    }
    for t in policy.tenants() {
        println!("  tenant {} ({} budgets)", t.name, t.budgets.len());
    }
    for s in policy.splits() {
        let arms: Vec<String> = s
            .arms
            .iter()
            .map(|a| format!("{} {}%", a.name, a.weight))
            .collect();
        let rule = if s.rollback().is_some() {
            ", with rollback rule"
        } else {
            ""
        };
        println!("  split {} ({}{rule})", s.name, arms.join(", "));
    }
    Ok(())
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn read_engine_state(path: &Path) -> anyhow::Result<StaticEngineView> {
    serde_json::from_str(&read_text(path)?).with_context(|| {
        format!(
            "{} is not engine state JSON: {{\"default\": {{...}}, \"checkpoints\": {{\"model@version\": {{\"queue_depth\": 3, ...}}}}}}",
            path.display()
        )
    })
}

/// Builds a routing request from an OpenAI chat or completions body.
fn read_request(path: &Path) -> anyhow::Result<RouteRequest> {
    let body: Value = serde_json::from_str(&read_text(path)?)
        .with_context(|| format!("{} is not a JSON request body", path.display()))?;
    let model = body.get("model").and_then(Value::as_str).unwrap_or("auto");
    let mut req = RouteRequest::new(ModelHint::parse(model), Caller::Anonymous);
    req.prompt_tokens = estimate_tokens(prompt_chars(&body));
    req.max_output_tokens = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    req.user = body.get("user").and_then(Value::as_str).map(str::to_string);
    Ok(req)
}

/// Characters of prompt text: chat message contents (strings or text parts) or `prompt`.
fn prompt_chars(body: &Value) -> usize {
    fn text_len(v: &Value) -> usize {
        match v {
            Value::String(s) => s.chars().count(),
            Value::Array(parts) => parts
                .iter()
                .map(|p| p.get("text").map_or_else(|| text_len(p), text_len))
                .sum(),
            _ => 0,
        }
    }
    match (body.get("messages"), body.get("prompt")) {
        (Some(Value::Array(msgs)), _) => msgs
            .iter()
            .filter_map(|m| m.get("content"))
            .map(text_len)
            .sum(),
        (_, Some(prompt)) => text_len(prompt),
        _ => 0,
    }
}

fn apply_headers(req: &mut RouteRequest, headers: &[String]) -> anyhow::Result<()> {
    let mut hints = Hints::default();
    for h in headers {
        let (name, value) = h
            .split_once(':')
            .with_context(|| format!("header `{h}` must be written `Name: value`"))?;
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("authorization") {
            let key = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
                .with_context(|| "authorization header must be `Bearer KEY`")?;
            req.caller = Caller::ApiKey(key.trim().to_string());
        } else if !hints.apply_header(name, value)? {
            eprintln!("note: header `{name}` does not affect routing; ignored");
        }
    }
    req.hints = hints;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_chat_and_completion_prompts() {
        let chat: Value = serde_json::json!({
            "messages": [
                {"role": "system", "content": "abcd"},
                {"role": "user", "content": [{"type": "text", "text": "efgh"}]}
            ]
        });
        assert_eq!(prompt_chars(&chat), 8);
        assert_eq!(
            prompt_chars(&serde_json::json!({"prompt": ["ab", "cd"]})),
            4
        );
        assert_eq!(prompt_chars(&serde_json::json!({})), 0);
    }

    #[test]
    fn headers_set_the_key_and_hints() {
        let mut req = RouteRequest::new(ModelHint::Auto, Caller::Anonymous);
        let headers = [
            "Authorization: Bearer sk-1".to_string(),
            "x-switchyard-min-quality: 0.6".to_string(),
            "x-switchyard-tags: code".to_string(),
        ];
        apply_headers(&mut req, &headers).unwrap();
        assert_eq!(req.caller, Caller::ApiKey("sk-1".into()));
        assert_eq!(req.hints.min_quality, Some(0.6));
        assert_eq!(req.hints.tags, vec!["code"]);
        assert!(apply_headers(&mut req, &["no colon".to_string()]).is_err());
        assert!(apply_headers(&mut req, &["x-switchyard-max-cost: lots".to_string()]).is_err());
    }
}
