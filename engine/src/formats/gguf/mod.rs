//! GGUF (v2 and v3): our own reader and writer.

mod metadata;

pub use metadata::{MetaValue, Metadata};
