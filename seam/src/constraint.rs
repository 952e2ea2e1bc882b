//! What the output must look like: a JSON schema (OpenAI's `response_format`)
//! or tool calls (`tool_choice` `required` or a named function), enforced by
//! the engine with a token mask at every step.
//!
//! Schemas cross the seam as JSON text so that this crate needs no JSON
//! library; the engine parses and compiles them, and refuses what its
//! grammar engine cannot enforce with the field named in [`Constraint::field`].

/// A function the model may call (OpenAI's `tools[i].function`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// The function's name, unique within a request.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON schema of its arguments, as JSON text (`{}` when the tool takes none).
    pub parameters: String,
}

/// One call the model made (OpenAI's `tool_calls[i]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The id the `tool` message answering this call quotes.
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// The output the engine must produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// Any JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid against `schema` (JSON text).
    JsonSchema {
        /// The schema, as the client sent it.
        schema: String,
        /// The request field that carried it, for errors
        /// (`response_format.json_schema.schema`).
        field: String,
    },
    /// One tool call (or, with `parallel`, one or more) of the named tools
    /// from the request's `tools`, in the `<tool_call>` form of
    /// [`TOOL_CALL_OPEN`]/[`TOOL_CALL_CLOSE`].
    ToolCalls {
        /// Which tools may be called (all of them for `required`).
        names: Vec<String>,
        /// Whether several calls may follow one another.
        parallel: bool,
    },
}

impl Constraint {
    /// The request field to name when the constraint cannot be enforced.
    pub fn field(&self) -> &str {
        match self {
            Constraint::JsonObject => "response_format",
            Constraint::JsonSchema { field, .. } => field,
            Constraint::ToolCalls { .. } => "tools",
        }
    }
}

/// Opens a tool call in the model's output. The Hermes form (Qwen2.5,
/// Hermes, many fine-tunes) is the one chat templates with tool support
/// already teach, so the same text works for them and for the prompt
/// Switchyard writes for templates without tools.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call; between the two, `{"name": ..., "arguments": {...}}`.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";
