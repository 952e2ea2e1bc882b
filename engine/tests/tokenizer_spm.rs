//! The SentencePiece (`llama`) GGUF path on a small synthetic vocabulary.
//!
//! The expected ids were produced by llama.cpp (llama-cpp-python 0.3.36,
//! `Llama(path, vocab_only=True).tokenize(text, add_bos=True, special=True)`)
//! on a GGUF file holding exactly the vocabulary built in `spm_metadata`.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::PathBuf;
use std::sync::Arc;

use switchyard_engine::formats::gguf::{MetaValue, Metadata};
use switchyard_engine::formats::TokenizerSource;
use switchyard_engine::tokenizer::{Tokenizer, TokenizerError};

const MERGED: &[&str] = &[
    "▁t",
    "he",
    "▁the",
    "▁a",
    "in",
    "▁w",
    "or",
    "ld",
    "▁wor",
    "▁world",
    "ll",
    "▁he",
    "▁hell",
    "▁hello",
    "an",
    "▁an",
    "▁and",
    "▁▁",
    "▁▁▁▁",
    "er",
    "▁H",
    "▁He",
    "ing",
    "▁s",
    "is",
    "▁is",
    "▁T",
    "▁Th",
    "▁The",
    "re",
    "ere",
    "▁th",
    "▁there",
];

/// Specials, 256 byte tokens, single characters, merged pieces, a control token.
fn spm_metadata() -> Metadata {
    let mut pieces: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i32> = vec![2, 3, 3];
    let mut scores: Vec<f32> = vec![0.0; 3];
    for b in 0..256 {
        pieces.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (i, c) in "▁abcdefghijklmnopqrstuvwxyzHTW.,!'é世".chars().enumerate() {
        pieces.push(c.to_string());
        types.push(1);
        scores.push(-100.0 - i as f32);
    }
    for (i, m) in MERGED.iter().enumerate() {
        pieces.push(m.to_string());
        types.push(1);
        scores.push(-1.0 - i as f32 * 0.5);
    }
    pieces.push("<|user|>".into());
    types.push(3);
    scores.push(0.0);

    let mut metadata = Metadata::default();
    let array = |values: Vec<MetaValue>| MetaValue::Array(values);
    metadata.insert("tokenizer.ggml.model", MetaValue::String("llama".into()));
    metadata.insert(
        "tokenizer.ggml.tokens",
        array(pieces.into_iter().map(MetaValue::String).collect()),
    );
    metadata.insert(
        "tokenizer.ggml.token_type",
        array(types.into_iter().map(MetaValue::I32).collect()),
    );
    metadata.insert(
        "tokenizer.ggml.scores",
        array(scores.into_iter().map(MetaValue::F32).collect()),
    );
    metadata.insert("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
    metadata.insert("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    metadata.insert("tokenizer.ggml.unknown_token_id", MetaValue::U32(0));
    metadata.insert("tokenizer.ggml.add_bos_token", MetaValue::Bool(true));
    metadata
}

fn load(metadata: Metadata) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::load(&TokenizerSource::Gguf {
        file: PathBuf::from("synthetic-spm.gguf"),
        metadata: Arc::new(metadata),
    })
}

#[test]
fn ids_match_llama_cpp() {
    let tok = load(spm_metadata()).unwrap();
    let cases: &[(&str, &[u32])] = &[
        ("Hello world", &[1, 316, 305, 274, 304]),
        ("the theре and", &[1, 297, 297, 212, 131, 211, 184, 311]),
        (
            "  The  world is there!",
            &[1, 312, 323, 259, 304, 320, 327, 291],
        ),
        ("<|user|>hello<|user|> the", &[1, 328, 308, 328, 259, 297]),
        (
            "héllo 世界 ✨",
            &[
                1, 259, 267, 293, 305, 274, 259, 294, 234, 152, 143, 259, 229, 159, 171,
            ],
        ),
        ("", &[1]),
        ("x\ny", &[1, 259, 283, 13, 284]),
        ("don't", &[1, 259, 263, 274, 273, 292, 279]),
    ];
    for (text, expected) in cases {
        assert_eq!(&tok.encode(text, true).unwrap(), expected, "{text:?}");
    }
    assert_eq!(tok.encode("Hello", false).unwrap(), vec![316, 305, 274]);
}

#[test]
fn decoding_restores_text_and_bytes() {
    let tok = load(spm_metadata()).unwrap();
    for text in ["Hello world", "héllo 世界 ✨", "x\ny", "  The  world"] {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(tok.decode(&ids, true).unwrap(), text);
    }
    assert_eq!(tok.bos_token(), "<s>");
    assert_eq!(tok.eos_token(), "</s>");
    assert_eq!(tok.eos_ids(), &[2]);
}

#[test]
fn streaming_decode_waits_for_whole_characters() {
    let tok = load(spm_metadata()).unwrap();
    let text = "héllo 世界 ✨ world";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = tok.decode_stream(true);
    let mut out = String::new();
    for id in ids {
        if let Some(piece) = stream.step(id).unwrap() {
            assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
            out.push_str(&piece);
        }
    }
    assert_eq!(stream.flush().unwrap(), None);
    assert_eq!(out, text);
}

#[test]
fn missing_scores_name_the_key_and_file() {
    let mut metadata = spm_metadata();
    metadata.entries.remove("tokenizer.ggml.scores");
    let message = load(metadata).unwrap_err().to_string();
    assert!(message.contains("tokenizer.ggml.scores"), "{message}");
    assert!(message.contains("synthetic-spm.gguf"), "{message}");
}

#[test]
fn unknown_model_is_a_clear_error() {
    let mut metadata = spm_metadata();
    metadata.insert("tokenizer.ggml.model", MetaValue::String("rwkv".into()));
    let message = load(metadata).unwrap_err().to_string();
    assert!(message.contains("`rwkv` is not supported"), "{message}");
}
