//! The model's output split into text and tool calls, whole or as it streams.
//!
//! A call is `<tool_call>` JSON `</tool_call>` with the JSON
//! `{"name": ..., "arguments": {...}}` (the Hermes form the engine's
//! templates and grammar use). Text that could still be the start of
//! `<tool_call>` is held back until the next piece tells; a block whose
//! JSON is not a call stays text, as the model wrote it.

use serde_json::Value;
use switchyard_seam::{TOOL_CALL_CLOSE, TOOL_CALL_OPEN};

/// A piece of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Plain text.
    Text(String),
    /// One call.
    Call(ParsedCall),
}

/// A call the model wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// Splits text fed to it piece by piece.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    /// Text not yet handed out.
    pending: String,
    /// Whether `pending` is inside an opened call.
    in_call: bool,
}

impl ToolCallParser {
    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut pieces = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(TOOL_CALL_CLOSE) else {
                    break;
                };
                let body: String = self.pending.drain(..end).collect();
                self.pending.drain(..TOOL_CALL_CLOSE.len());
                self.in_call = false;
                pieces.push(call_or_text(&body, true));
            } else if let Some(start) = self.pending.find(TOOL_CALL_OPEN) {
                push_text(&mut pieces, self.pending.drain(..start).collect());
                self.pending.drain(..TOOL_CALL_OPEN.len());
                self.in_call = true;
            } else {
                let keep = held_back(&self.pending);
                let ready = self.pending.len() - keep;
                push_text(&mut pieces, self.pending.drain(..ready).collect());
                break;
            }
        }
        pieces
    }

    /// What is left when the output ends: held-back text, or a call the
    /// model never closed (kept when its JSON is a whole call).
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        let mut pieces = Vec::new();
        if std::mem::take(&mut self.in_call) {
            pieces.push(call_or_text(&rest, false));
        } else {
            push_text(&mut pieces, rest);
        }
        pieces
    }
}

/// The whole of `text`, split, neighbouring text joined.
pub fn split(text: &str) -> Vec<Piece> {
    let mut parser = ToolCallParser::default();
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    join_text(pieces)
}

/// `pieces` with each run of text pieces made one.
fn join_text(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut joined: Vec<Piece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match (joined.last_mut(), piece) {
            (Some(Piece::Text(last)), Piece::Text(more)) => last.push_str(&more),
            (_, piece) => joined.push(piece),
        }
    }
    joined
}

fn push_text(pieces: &mut Vec<Piece>, text: String) {
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
}

/// Bytes at the end of `text` that may begin `<tool_call>`.
fn held_back(text: &str) -> usize {
    (1..TOOL_CALL_OPEN.len())
        .rev()
        .find(|&n| text.ends_with(&TOOL_CALL_OPEN[..n]))
        .unwrap_or(0)
}

fn call_or_text(body: &str, closed: bool) -> Piece {
    match parse_call(body) {
        Some(call) => Piece::Call(call),
        None => {
            let close = if closed { TOOL_CALL_CLOSE } else { "" };
            Piece::Text(format!("{TOOL_CALL_OPEN}{body}{close}"))
        }
    }
}

fn parse_call(body: &str) -> Option<ParsedCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = match value.get("arguments") {
        None | Some(Value::Null) => "{}".to_owned(),
        // Some models write the arguments already encoded as a string.
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

/// A fresh tool-call id, unique across requests (`call_` and 24 hex digits, as OpenAI's look).
pub fn new_call_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("call_{}", &id[..24])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> Piece {
        Piece::Call(ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        })
    }

    const TWO: &str = "Sure.<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn whole_output_splits_into_text_and_calls() {
        assert_eq!(
            split(TWO),
            vec![
                Piece::Text("Sure.".into()),
                call("a", "{\"x\":1}"),
                Piece::Text("\n".into()),
                call("b", "{}"),
            ]
        );
        assert_eq!(
            split("plain <tool"),
            vec![Piece::Text("plain <tool".into())]
        );
        assert_eq!(
            split("<tool_call>not json</tool_call>"),
            vec![Piece::Text("<tool_call>not json</tool_call>".into())]
        );
    }

    #[test]
    fn any_split_of_the_stream_gives_the_same_pieces() {
        let whole = split(TWO);
        for size in 1..8 {
            let mut parser = ToolCallParser::default();
            let mut pieces = Vec::new();
            let chars: Vec<char> = TWO.chars().collect();
            for chunk in chars.chunks(size) {
                pieces.extend(parser.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(parser.finish());
            // Text may arrive in several pieces; join neighbours to compare.
            assert_eq!(join_text(pieces), whole, "chunks of {size}");
        }
    }

    #[test]
    fn text_that_may_open_a_call_is_held_back() {
        let mut parser = ToolCallParser::default();
        assert_eq!(parser.push("Hi <tool_"), vec![Piece::Text("Hi ".into())]);
        assert_eq!(parser.push("box>"), vec![Piece::Text("<tool_box>".into())]);
        assert_eq!(parser.finish(), vec![]);
    }
}
