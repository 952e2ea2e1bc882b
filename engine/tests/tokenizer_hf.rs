//! The tokenizer.json path: loading, BOS handling from the post-processor or
//! tokenizer_config.json, chat template lookup, and error messages.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use switchyard_engine::formats::TokenizerSource;
use switchyard_engine::tokenizer::{Tokenizer, TokenizerError};

/// A word-level-ish BPE tokenizer.json whose post-processor adds `<s>`.
const TOKENIZER_JSON: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "<|eot_id|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "post_processor": {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}
  },
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {
    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
    "vocab": {"<s>": 0, "</s>": 1, "<|eot_id|>": 2, "h": 3, "i": 4, "Ġ": 5, "hi": 6, "Ġhi": 7},
    "merges": ["h i", "Ġ hi"]
  }
}"#;

fn write(dir: &Path, config: Option<&str>) -> TokenizerSource {
    let tokenizer_json = dir.join("tokenizer.json");
    std::fs::write(&tokenizer_json, TOKENIZER_JSON).unwrap();
    let tokenizer_config = config.map(|text| {
        let path = dir.join("tokenizer_config.json");
        std::fs::write(&path, text).unwrap();
        path
    });
    TokenizerSource::HuggingFace {
        tokenizer_json,
        tokenizer_config,
    }
}

#[test]
fn post_processor_bos_is_detected_without_a_config() {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tokenizer::load(&write(dir.path(), None)).unwrap();
    assert_eq!(tok.bos_id(), Some(0));
    assert_eq!(tok.encode("hi hi", true).unwrap(), vec![0, 6, 7]);
    assert_eq!(tok.encode("hi hi", false).unwrap(), vec![6, 7]);
    assert_eq!(tok.encode("hi<|eot_id|>", false).unwrap(), vec![6, 2]);
    assert_eq!(tok.decode(&[0, 6, 7, 2], true).unwrap(), "hi hi");
    assert_eq!(tok.chat_template(), None);
}

#[test]
fn config_sets_tokens_template_and_bos_flag() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{
        "bos_token": {"content": "<s>", "special": true},
        "eos_token": "</s>",
        "add_bos_token": false,
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ messages }}"}
        ]
    }"#;
    let tok = Tokenizer::load(&write(dir.path(), Some(config))).unwrap();
    assert_eq!(tok.encode("hi", true).unwrap(), vec![6]);
    assert_eq!(tok.bos_token(), "<s>");
    assert_eq!(tok.eos_token(), "</s>");
    assert_eq!(tok.eos_ids(), &[1, 2]);
    assert_eq!(tok.chat_template(), Some("{{ messages }}"));
}

#[test]
fn errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = TokenizerSource::HuggingFace {
        tokenizer_json: dir.path().join("tokenizer.json"),
        tokenizer_config: None,
    };
    let err = Tokenizer::load(&missing).unwrap_err();
    assert!(matches!(err, TokenizerError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("tokenizer.json"));

    let bad: PathBuf = dir.path().join("bad.json");
    std::fs::write(&bad, "{ nope").unwrap();
    let err = Tokenizer::load(&TokenizerSource::HuggingFace {
        tokenizer_json: bad.clone(),
        tokenizer_config: None,
    })
    .unwrap_err();
    assert!(
        matches!(err, TokenizerError::InvalidTokenizerJson { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("bad.json"));

    let err = Tokenizer::load(&write(dir.path(), Some("[1, 2]"))).unwrap_err();
    assert!(
        matches!(err, TokenizerError::InvalidTokenizerConfig { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("tokenizer_config.json"));
}
