//! The GGUF-built tokenizer on the real SmolLM2 checkpoint.

mod tokenizer_common;

use switchyard_engine::tokenizer::Tokenizer;

#[test]
fn smollm2_scratch() {
    let Some(path) = tokenizer_common::smollm2_path() else {
        return;
    };
    let tok = Tokenizer::load(&tokenizer_common::gguf_source(&path)).unwrap();
    for text in [
        "Hello world",
        "12345 apples",
        "<|im_start|>user\nHi<|im_end|>",
        "  two  spaces\t\ttabs\n\n",
        "héllo 🤖 世界",
    ] {
        let ids = tok.encode(text, true).unwrap();
        println!(
            "{text:?} -> {ids:?} -> {:?}",
            tok.decode(&ids, false).unwrap()
        );
    }
    println!(
        "bos {:?} eos {:?} vocab {}",
        tok.bos_id(),
        tok.eos_ids(),
        tok.vocab_size()
    );
}
