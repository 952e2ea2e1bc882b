//! The OpenAI-compatible API: wire types, parsing into validated requests,
//! and the handlers.

pub mod chat;
pub mod chat_stream;
pub mod completions;
pub mod completions_stream;
pub mod embeddings;
pub mod json_response;
pub mod models;
pub mod params;
pub mod parse;
pub mod respond;
pub mod response_format;
pub mod responses;
pub mod tail;
pub mod tool_calls;
pub mod tools;
pub mod types;
