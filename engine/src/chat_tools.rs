//! Tools in a conversation: what a chat template sees of them, and the
//! Hermes-style prompt Switchyard writes for templates that know no tools.
//!
//! Templates written for tool calling (Qwen2.5, Hermes, Llama 3.1) render
//! `tools`, an assistant turn's `tool_calls` and `tool` turns themselves.
//! Most small chat models' templates (SmolLM2, Gemma 3) do not; for them the
//! conversation is rewritten before rendering, the way those fine-tunes
//! were taught by the Hermes format: the tools listed in the system turn,
//! calls as `<tool_call>` text in the assistant turn, results as a user
//! turn wrapped in `<tool_response>`. Either way the model answers with
//! `<tool_call>` blocks, the form the router parses.

use serde_json::{json, Value};
use switchyard_seam::{ChatMessage, Role, Tool, ToolCall, TOOL_CALL_CLOSE, TOOL_CALL_OPEN};

/// `tools` as OpenAI sends them and templates iterate them:
/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
pub fn tools_value(tools: &[Tool]) -> Vec<Value> {
    tools
        .iter()
        .map(|tool| {
            let mut function = json!({"name": tool.name});
            if let Some(description) = &tool.description {
                function["description"] = json!(description);
            }
            function["parameters"] = parse_or_text(&tool.parameters);
            json!({"type": "function", "function": function})
        })
        .collect()
}

/// One call as templates read it; `arguments` parsed, as transformers passes it.
pub fn tool_call_value(call: &ToolCall) -> Value {
    json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": parse_or_text(&call.arguments)},
    })
}

/// One call as the model writes it.
pub fn tool_call_text(call: &ToolCall) -> String {
    let body = json!({"name": call.name, "arguments": parse_or_text(&call.arguments)});
    format!("{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}")
}

/// `messages` rewritten for a template without tool support (see the module docs).
pub fn hermes_conversation(messages: &[ChatMessage], tools: &[Tool]) -> Vec<ChatMessage> {
    let mut rewritten: Vec<ChatMessage> = messages
        .iter()
        .map(|message| match message.role {
            Role::Assistant if !message.tool_calls.is_empty() => {
                let mut parts: Vec<String> = Vec::new();
                if !message.content.is_empty() {
                    parts.push(message.content.clone());
                }
                parts.extend(message.tool_calls.iter().map(tool_call_text));
                ChatMessage::new(Role::Assistant, parts.join("\n"))
            }
            Role::Tool => ChatMessage::new(
                Role::User,
                format!("<tool_response>\n{}\n</tool_response>", message.content),
            ),
            _ => message.clone(),
        })
        .collect();
    if tools.is_empty() {
        return rewritten;
    }
    let instructions = tools_instructions(tools);
    match rewritten.first_mut() {
        Some(first) if matches!(first.role, Role::System | Role::Developer) => {
            first.content = format!("{}\n\n{instructions}", first.content);
        }
        _ => rewritten.insert(0, ChatMessage::new(Role::System, instructions)),
    }
    rewritten
}

/// The system text that lists the tools and says how to call them (Qwen2.5's wording).
fn tools_instructions(tools: &[Tool]) -> String {
    let listed: Vec<String> = tools_value(tools).iter().map(Value::to_string).collect();
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n\
         <tools>\n{}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments \
         within {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n\
         {TOOL_CALL_OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n{TOOL_CALL_CLOSE}",
        listed.join("\n")
    )
}

fn parse_or_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: Some("Current weather".into()),
            parameters: r#"{"type":"object","properties":{"city":{"type":"string"}}}"#.into(),
        }
    }

    #[test]
    fn calls_and_results_become_hermes_text() {
        let mut call = ChatMessage::new(Role::Assistant, "");
        call.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        });
        let mut result = ChatMessage::new(Role::Tool, "18C");
        result.tool_call_id = Some("call_1".into());
        let messages = [ChatMessage::new(Role::User, "Weather?"), call, result];
        let rewritten = hermes_conversation(&messages, &[weather()]);
        assert_eq!(rewritten.len(), 4);
        assert_eq!(rewritten[0].role, Role::System);
        assert!(rewritten[0].content.contains("\"name\":\"get_weather\""));
        assert_eq!(
            rewritten[2].content,
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert_eq!(rewritten[3].role, Role::User);
        assert_eq!(
            rewritten[3].content,
            "<tool_response>\n18C\n</tool_response>"
        );
    }

    #[test]
    fn tools_join_an_existing_system_turn() {
        let messages = [ChatMessage::new(Role::System, "Be brief.")];
        let rewritten = hermes_conversation(&messages, &[weather()]);
        assert_eq!(rewritten.len(), 1);
        assert!(rewritten[0].content.starts_with("Be brief.\n\n# Tools"));
    }
}
