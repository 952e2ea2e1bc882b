//! Hugging Face layout: `tokenizer.json`, plus `tokenizer_config.json` for
//! the chat template, the BOS/EOS texts and `add_bos_token`.

use std::path::Path;

use serde_json::Value;

use super::parts::Parts;
use super::TokenizerError;

pub(super) fn load(
    tokenizer_json: &Path,
    config_path: Option<&Path>,
) -> Result<Parts, TokenizerError> {
    let bytes = std::fs::read(tokenizer_json).map_err(|source| TokenizerError::Read {
        path: tokenizer_json.to_path_buf(),
        source,
    })?;
    let tok = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
        TokenizerError::InvalidTokenizerJson {
            path: tokenizer_json.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    let config = match config_path {
        Some(path) => read_config(path)?,
        None => Value::Null,
    };

    let token_id =
        |key: &str| special_token_text(config.get(key)).and_then(|text| tok.token_to_id(&text));
    let (post_bos, post_eos) = post_processor_ids(&tok);
    // Without a config, the ids the post-processor adds are the BOS/EOS.
    let bos_id = token_id("bos_token").or(post_bos);
    let eos_id = token_id("eos_token").or(post_eos);
    let post_adds_bos = post_bos.is_some() && post_bos == bos_id;
    let post_adds_eos = post_eos.is_some() && post_eos == eos_id;
    // An explicit flag in tokenizer_config.json wins: transformers rebuilds
    // the post-processor from it for Llama-style tokenizers.
    let add_bos = config
        .get("add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or(post_adds_bos);
    let add_eos = config
        .get("add_eos_token")
        .and_then(Value::as_bool)
        .unwrap_or(post_adds_eos);

    Ok(Parts {
        chat_template: chat_template(&config),
        tok,
        bos_id,
        eos_id,
        extra_eos: Vec::new(),
        add_bos,
        add_eos,
    })
}

fn read_config(path: &Path) -> Result<Value, TokenizerError> {
    let bytes = std::fs::read(path).map_err(|source| TokenizerError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|e| TokenizerError::InvalidTokenizerConfig {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if !value.is_object() {
        return Err(TokenizerError::InvalidTokenizerConfig {
            path: path.to_path_buf(),
            reason: "the top level is not a JSON object".to_string(),
        });
    }
    Ok(value)
}

/// A special token entry is either `"<s>"` or `{"content": "<s>", ...}`.
fn special_token_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which
/// the one named `default` is the chat template.
fn chat_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|entry| entry.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// The ids the tokenizer.json post-processor puts before and after text
/// (BOS, EOS), found by encoding a probe text with and without it.
fn post_processor_ids(tok: &tokenizers::Tokenizer) -> (Option<u32>, Option<u32>) {
    // Probes that any real vocabulary encodes to a few non-special ids.
    for probe in ["a", "Hello", "hi", "0"] {
        let (Ok(with), Ok(without)) = (tok.encode_fast(probe, true), tok.encode_fast(probe, false))
        else {
            continue;
        };
        let (with, without) = (with.get_ids(), without.get_ids());
        if without.is_empty() {
            continue;
        }
        // The probe's own ids sit somewhere inside `with`; what is around them was added.
        let Some(start) = with.windows(without.len()).position(|w| w == without) else {
            continue;
        };
        let before = with.get(..start).and_then(|ids| ids.last().copied());
        let after = with
            .get(start + without.len()..)
            .and_then(|ids| ids.first().copied());
        return (before, after);
    }
    (None, None)
}
