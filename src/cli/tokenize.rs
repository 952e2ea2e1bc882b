//! `switchyard tokenize`: the token ids a checkpoint's tokenizer gives, as JSON.
//!
//! For checking our tokenizer against reference implementations:
//! `--text T` prints `{"ids": [...]}`; `--input FILE` (a JSON array of
//! strings) prints an array of id arrays; `--chat FILE` (a JSON array of
//! `{role, content}`) renders the chat template with the generation prompt
//! and prints `{"text": ..., "ids": [...]}`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use switchyard_engine::chat_choice::{self, TemplateSpec};
use switchyard_engine::formats::{load_checkpoint, TokenizerSource};
use switchyard_engine::model::config::Architecture;
use switchyard_engine::prompt::chat_prompt;
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_seam::{ChatMessage, Role};

#[derive(clap::Args)]
#[command(group(
    clap::ArgGroup::new("what").required(true).args(["text", "input", "chat"])
))]
pub struct TokenizeArgs {
    /// The checkpoint: a GGUF file or a Hugging Face folder (or a lone tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Text to tokenize.
    #[arg(long)]
    pub text: Option<String>,
    /// A JSON file holding an array of strings to tokenize.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// A JSON file holding an array of {"role", "content"} messages to render
    /// with the chat template and tokenize.
    #[arg(long)]
    pub chat: Option<PathBuf>,
    /// Do not add the BOS/EOS tokens the model asks for (--text, --input).
    #[arg(long)]
    pub no_special: bool,
    /// The chat template for --chat, as `serve --chat-template` takes it: a
    /// known template's name (chatml, gemma) or a Jinja file.
    #[arg(long, requires = "chat")]
    pub chat_template: Option<String>,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let (source, architecture) = tokenizer_source(&args.model)?;
    let tokenizer = Tokenizer::load(&source)
        .with_context(|| format!("loading the tokenizer of {}", args.model.display()))?;
    let add_special = !args.no_special;

    let output = if let Some(text) = &args.text {
        serde_json::json!({ "ids": tokenizer.encode(text, add_special)? })
    } else if let Some(path) = &args.input {
        let expected = "a JSON array of strings";
        let texts: Vec<String> = serde_json::from_value(read_json(path)?)
            .with_context(|| format!("{} is not {expected}", path.display()))?;
        let ids = texts
            .iter()
            .map(|text| tokenizer.encode(text, add_special))
            .collect::<Result<Vec<_>, _>>()?;
        serde_json::json!(ids)
    } else if let Some(path) = &args.chat {
        let expected = "a JSON array of {\"role\", \"content\"} objects";
        let turns: Vec<Turn> = serde_json::from_value(read_json(path)?)
            .with_context(|| format!("{} is not {expected}", path.display()))?;
        let messages = turns
            .into_iter()
            .map(|turn| match Role::parse(&turn.role) {
                Some(role) => Ok(ChatMessage::new(role, turn.content)),
                None => Err(anyhow::anyhow!(
                    "{}: '{}' is not a role; use system, developer, user or assistant",
                    path.display(),
                    turn.role
                )),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let spec = args
            .chat_template
            .as_ref()
            .map(|value| TemplateSpec::new(value, "--chat-template"));
        let (template, origin) = chat_choice::choose(spec.as_ref(), &tokenizer, architecture)?;
        let (text, ids) = chat_prompt(&messages, &[], &tokenizer, &template)?;
        serde_json::json!({ "text": text, "ids": ids, "template": origin.to_string() })
    } else {
        anyhow::bail!("give one of --text, --input or --chat");
    };
    println!("{output}");
    Ok(())
}

/// One `{role, content}` object of a `--chat` file.
#[derive(serde::Deserialize)]
struct Turn {
    role: String,
    content: String,
}

/// A `tokenizer.json` file stands alone (its sibling `tokenizer_config.json`
/// is used when present); anything else is loaded as a checkpoint.
/// The tokenizer and, for a checkpoint, its architecture (which picks a
/// family's chat template when the file has none).
fn tokenizer_source(model: &Path) -> anyhow::Result<(TokenizerSource, Option<Architecture>)> {
    if model.is_file() && model.extension().is_some_and(|ext| ext == "json") {
        let config = model.with_file_name("tokenizer_config.json");
        let source = TokenizerSource::HuggingFace {
            tokenizer_json: model.to_path_buf(),
            tokenizer_config: config.is_file().then_some(config),
        };
        return Ok((source, None));
    }
    let checkpoint = load_checkpoint(model)
        .with_context(|| format!("loading checkpoint {}", model.display()))?;
    Ok((checkpoint.tokenizer, Some(checkpoint.config.architecture)))
}

fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{} is not valid JSON", path.display()))
}
