//! Small deterministic checkpoints for tests, written as GGUF or safetensors.
