//! The checks of every fuzz target, as plain functions of the input bytes, so that
//! cargo-fuzz (`fuzz/`, libFuzzer, nightly) and the stable mutation replay
//! (`fuzz-replay`, no instrumentation) run exactly the same code.
//!
//! Each function feeds arbitrary bytes to one parser a stranger can reach and panics
//! only when the parser breaks a promise (a panic inside it, or an accepted input that
//! violates its invariants). Errors are expected and fine.

mod targets;

pub mod mutate;
pub mod seeds;

pub use targets::{
    chat_template, gguf_reader, openai_request, policy_toml, safetensors_shard, structured_schema,
    FUZZ_KEY,
};

/// A fuzz target: its name (as `fuzz/fuzz_targets/<name>.rs` and the corpus folder
/// call it) and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order the scripts run them.
pub const TARGETS: [Target; 6] = [
    ("gguf_reader", gguf_reader),
    ("safetensors_shard", safetensors_shard),
    ("policy_toml", policy_toml),
    ("openai_request", openai_request),
    ("chat_template", chat_template),
    ("structured_schema", structured_schema),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|(n, _)| *n == name)
}
