//! The GGUF-built byte-level BPE tokenizer on the real SmolLM2 checkpoint. Expected ids come
//! from llama.cpp (llama-cpp-python 0.3.36, vocab only, special=True);
//! tests/python/test_tokenizer.py compares a large corpus live.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/real_models.rs"]
mod real_models;
mod tokenizer_common;

use switchyard_engine::formats::gguf::MetaValue;
use switchyard_engine::formats::TokenizerSource;
use switchyard_engine::tokenizer::Tokenizer;

fn smollm2() -> (TokenizerSource, Tokenizer) {
    let source = tokenizer_common::gguf_source(&real_models::smollm2());
    let tok = Tokenizer::load(&source).unwrap();
    (source, tok)
}

#[test]
fn ids_match_llama_cpp() {
    let (_, tok) = smollm2();
    let cases: &[(&str, &[u32])] = &[
        ("Hello world", &[19556, 905]),
        ("12345 apples", &[33, 34, 35, 36, 37, 13855]),
        ("<|im_start|>user\nHi<|im_end|>", &[1, 4093, 198, 26843, 2]),
        (
            "  two  spaces\t\ttabs\n\n",
            &[216, 827, 216, 5600, 197, 197, 100, 7366, 1116],
        ),
        (
            "héllo 🤖 世界",
            &[
                88, 2756, 31394, 15107, 114, 240, 216, 7906, 240, 178, 239, 230,
            ],
        ),
        ("", &[]),
    ];
    for (text, expected) in cases {
        // SmolLM2 does not ask for BOS, so both modes agree.
        assert_eq!(&tok.encode(text, true).unwrap(), expected, "{text:?}");
        assert_eq!(&tok.encode(text, false).unwrap(), expected, "{text:?}");
    }
}

#[test]
fn special_ids_and_template() {
    let (_, tok) = smollm2();
    assert_eq!(tok.bos_id(), Some(1));
    assert!(!tok.adds_bos());
    assert_eq!(tok.eos_ids(), &[2, 0]); // <|im_end|>, then <|endoftext|>
    assert_eq!(tok.bos_token(), "<|im_start|>");
    assert_eq!(tok.eos_token(), "<|im_end|>");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.token_text(198).as_deref(), Some("Ċ"));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
}

#[test]
fn decode_round_trips_and_skips_specials() {
    let (_, tok) = smollm2();
    let text = "<|im_start|>user\nnaïve café 👨\u{200d}👩\u{200d}👧 1234\t\n<|im_end|>";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "user\nnaïve café 👨\u{200d}👩\u{200d}👧 1234\t\n"
    );
    assert!(tok.decode(&[49152], false).is_err());
}

#[test]
fn streaming_decode_emits_whole_characters_only() {
    let (_, tok) = smollm2();
    let text = "Emoji 🤖 and 世界, ZWJ 👨\u{200d}👩\u{200d}👧 done.";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = tok.decode_stream(false);
    let mut out = String::new();
    let mut held_back = 0;
    for id in ids {
        match stream.step(id).unwrap() {
            Some(piece) => {
                assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
                out.push_str(&piece);
            }
            None => held_back += 1,
        }
    }
    assert!(
        held_back > 0,
        "multi-byte characters span several byte tokens"
    );
    assert_eq!(stream.flush().unwrap(), None);
    assert_eq!(out, text);
}

#[test]
fn unsupported_pre_tokenizer_is_named() {
    let (source, _) = smollm2();
    let TokenizerSource::Gguf { file, metadata } = source else {
        unreachable!()
    };
    let mut metadata = (*metadata).clone();
    metadata.insert("tokenizer.ggml.pre", MetaValue::String("mystery".into()));
    let err = Tokenizer::load(&TokenizerSource::Gguf {
        file: file.clone(),
        metadata: metadata.clone().into(),
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("`mystery`") && err.contains("smollm"), "{err}");

    metadata.entries.remove("tokenizer.ggml.merges");
    metadata.insert("tokenizer.ggml.pre", MetaValue::String("smollm".into()));
    let err = Tokenizer::load(&TokenizerSource::Gguf {
        file: file.clone(),
        metadata: metadata.into(),
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("tokenizer.ggml.merges") && err.contains(&*file.to_string_lossy()),
        "{err}"
    );
}
