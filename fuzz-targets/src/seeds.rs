//! Valid inputs of each target, built here so that a fresh checkout fuzzes from real
//! structure (libFuzzer mutates them too: `scripts/fuzz.sh` writes them into its
//! corpora).

use bytes::Bytes;
use switchyard_engine::formats::gguf::{GgufWriter, MetaValue};
use switchyard_kernels::DType;

/// The seeds of target `name` (none for an unknown name).
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "gguf_reader" => vec![gguf()],
        "safetensors_shard" => vec![safetensors()],
        "policy_toml" => POLICIES.iter().map(|p| p.as_bytes().to_vec()).collect(),
        "openai_request" => OPENAI.iter().map(|b| b.as_bytes().to_vec()).collect(),
        "chat_template" => CHAT.iter().map(|c| c.to_vec()).collect(),
        "structured_schema" => SCHEMAS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        _ => Vec::new(),
    }
}

/// A small GGUF v3 file: typed metadata (string, u32, string array, f32) and two
/// tensors (a Q8_0 matrix and an F32 vector).
fn gguf() -> Vec<u8> {
    let mut writer = GgufWriter::new("seed.gguf");
    writer.add_metadata("general.architecture", MetaValue::String("llama".into()));
    writer.add_metadata("llama.context_length", MetaValue::U32(64));
    writer.add_metadata(
        "tokenizer.ggml.tokens",
        MetaValue::Array(vec![
            MetaValue::String("a".into()),
            MetaValue::String("b".into()),
        ]),
    );
    writer.add_metadata(
        "llama.attention.layer_norm_rms_epsilon",
        MetaValue::F32(1e-5),
    );
    // Q8_0: one f16 scale and 32 signed bytes per block.
    let mut block = vec![0u8; 34];
    block[1] = 0x3c;
    let q8 = Bytes::from([block.clone(), block].concat());
    let f32s = Bytes::from(vec![0u8; 32 * 4]);
    let added = writer
        .add_tensor("token_embd.weight", DType::Q8_0, &[2, 32], q8)
        .and_then(|()| writer.add_tensor("output_norm.weight", DType::F32, &[32], f32s));
    added
        .and_then(|()| writer.to_bytes())
        .expect("the seed GGUF is well formed")
}

/// One F32 tensor of two elements.
fn safetensors() -> Vec<u8> {
    let header =
        br#"{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(&[0; 8]);
    out
}

/// The policies the repository ships as examples.
const POLICIES: [&str; 3] = [
    include_str!("../../examples/policy-ab-rollout.toml"),
    include_str!("../../examples/policy-cost-saver.toml"),
    include_str!("../../examples/policy-multi-tenant.toml"),
];

const OPENAI: [&str; 3] = [
    r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"n":2,"stop":["x"],"logit_bias":{"5":1},"logprobs":true,"top_logprobs":3,"stream":true,"stream_options":{"include_usage":true}}"#,
    r#"{"model":"m","prompt":["a",[1,2]],"n":3,"max_tokens":5,"temperature":0.5,"seed":-1,"user":"u"}"#,
    r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],"max_completion_tokens":8,"top_p":0.9,"presence_penalty":1.5}"#,
];

const CHAT: [&[u8]; 3] = [
    b"\x00system\x00Be brief.\x00user\x00Hello {{ x }}\x00assistant\x00",
    b"\x05user\x00  padded  \x00developer\x00rules",
    b"\x03{% for m in messages %}{{ m.role }}{% endfor %}",
];

/// Schemas as clients send them: an OpenAI strict object, a recursive `$ref`, a chain
/// of `$ref`s, nesting, and the keywords the grammar engine handles (enums, patterns,
/// `anyOf`, bounds).
const SCHEMAS: [&str; 5] = [
    r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},"required":["name","age","tags"],"additionalProperties":false}"#,
    r##"{"$defs":{"node":{"type":"object","properties":{"value":{"type":"number"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"$ref":"#/$defs/node"}"##,
    r##"{"$defs":{"d0":{"$ref":"#/$defs/d1"},"d1":{"$ref":"#/$defs/d2"},"d2":{"type":"integer"}},"$ref":"#/$defs/d0"}"##,
    r#"{"type":"array","items":{"type":"array","items":{"type":"object","properties":{"x":{"type":"array","items":{"type":"string"}}}}}}"#,
    r#"{"anyOf":[{"type":"string","pattern":"^[a-z]{1,8}$"},{"type":"boolean"},{"type":"null"}],"x-guidance":{"whitespace_flexible":true}}"#,
];
