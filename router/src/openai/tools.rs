//! `tools`, `tool_choice` and `parallel_tool_calls`: which functions the
//! model sees, and whether it may, must, or must not call them.
//!
//! `auto` leaves the model free and parses whatever `<tool_call>` blocks it
//! writes; `required` and a named function are enforced by the engine's
//! grammar, so the answer is always a call of a listed tool whose arguments
//! match that tool's schema.

use std::collections::HashSet;

use serde_json::Value;

use crate::error::ApiError;
use crate::openai::params::{describe, invalid};
use switchyard_seam::{Constraint, Tool};

/// The tool settings of one chat request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolSettings {
    /// The tools shown to the model (none under `tool_choice: "none"`).
    pub tools: Vec<Tool>,
    /// What the model must do with them.
    pub choice: ToolChoice,
    /// Whether one answer may hold several calls.
    pub parallel: bool,
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No calls: tools are neither shown nor parsed.
    None,
    /// The model decides; calls it writes are parsed.
    #[default]
    Auto,
    /// At least one call, of any tool.
    Required,
    /// A call of this function.
    Named(String),
}

impl ToolSettings {
    /// Whether the answer is parsed for tool calls.
    pub fn parses_calls(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The grammar the engine must enforce, for `required` and named choices.
    pub fn constraint(&self) -> Option<Constraint> {
        let names = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.iter().map(|t| t.name.clone()).collect(),
            ToolChoice::Named(name) => vec![name.clone()],
        };
        Some(Constraint::ToolCalls {
            names,
            parallel: self.parallel,
        })
    }
}

/// Checks the three fields together.
pub fn parse_tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<ToolSettings, ApiError> {
    let mut tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| parse_tool(i, item))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: "tools".to_owned(),
                detail: format!("expected an array of tools, found {}", describe(other)),
            })
        }
    };
    // One pass with a set: comparing each name with every earlier one took seconds of
    // an async worker for a list of 70,000 tools.
    let mut seen = HashSet::with_capacity(tools.len());
    if let Some((i, tool)) = tools
        .iter()
        .enumerate()
        .find(|(_, tool)| !seen.insert(tool.name.as_str()))
    {
        return Err(invalid(
            &format!("tools[{i}].function.name"),
            format!(
                "'{}' names two tools; tool names must be unique.",
                tool.name
            ),
        ));
    }
    let choice = parse_choice(choice, &tools)?;
    if choice == ToolChoice::None {
        tools.clear();
    }
    Ok(ToolSettings {
        tools,
        choice,
        parallel: parallel.unwrap_or(true),
    })
}

fn parse_tool(i: usize, item: &Value) -> Result<Tool, ApiError> {
    let field = |name: &str| format!("tools[{i}].{name}");
    match item.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(invalid(
                &field("type"),
                format!("'{other}' tools are not supported; use type 'function'."),
            ))
        }
        None => {
            return Err(ApiError::MissingParameter {
                param: field("type"),
            })
        }
    }
    let Some(function) = item.get("function").filter(|f| f.is_object()) else {
        return Err(ApiError::MissingParameter {
            param: field("function"),
        });
    };
    let name = match function.get("name") {
        Some(Value::String(name)) => name.clone(),
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: field("function.name"),
                detail: format!("expected a string, found {}", describe(other)),
            })
        }
        None => {
            return Err(ApiError::MissingParameter {
                param: field("function.name"),
            })
        }
    };
    let valid_name = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(invalid(
            &field("function.name"),
            format!("'{name}' is not a function name; use 1 to 64 letters, digits, '_' or '-'."),
        ));
    }
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: field("function.description"),
                detail: format!("expected a string, found {}", describe(other)),
            })
        }
    };
    let parameters = match function.get("parameters") {
        // OpenAI: omitting parameters defines a function with an empty parameter list.
        None | Some(Value::Null) => "{\"type\": \"object\", \"properties\": {}}".to_owned(),
        Some(schema @ Value::Object(_)) => schema.to_string(),
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: field("function.parameters"),
                detail: format!("expected a JSON schema object, found {}", describe(other)),
            })
        }
    };
    Ok(Tool {
        name,
        description,
        parameters,
    })
}

fn parse_choice(choice: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let choice = match choice {
        None | Some(Value::Null) => return Ok(ToolChoice::Auto),
        Some(Value::String(mode)) => match mode.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(invalid(
                    "tool_choice",
                    format!("'{other}' is not a tool choice; use 'none', 'auto', 'required' or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}."),
                ))
            }
        },
        Some(object @ Value::Object(_)) => {
            match object.get("function").and_then(|f| f.get("name")) {
                Some(Value::String(name)) => ToolChoice::Named(name.clone()),
                _ => {
                    return Err(ApiError::MissingParameter {
                        param: "tool_choice.function.name".to_owned(),
                    })
                }
            }
        }
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: "tool_choice".to_owned(),
                detail: format!("expected a string or an object, found {}", describe(other)),
            })
        }
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(invalid(
            "tool_choice",
            "'required' needs tools; send 'tools' or drop 'tool_choice'.".to_owned(),
        )),
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => Err(invalid(
            "tool_choice",
            format!("no tool named '{name}' is in 'tools'; name one of the tools sent."),
        )),
        _ => Ok(choice),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    }

    #[test]
    fn choices_become_constraints() {
        let auto = parse_tools(Some(&weather()), None, None).unwrap();
        assert!(auto.parses_calls());
        assert_eq!(auto.constraint(), None);
        let required =
            parse_tools(Some(&weather()), Some(&json!("required")), Some(false)).unwrap();
        assert_eq!(
            required.constraint(),
            Some(Constraint::ToolCalls {
                names: vec!["get_weather".into()],
                parallel: false
            })
        );
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let named = parse_tools(Some(&weather()), Some(&named), None).unwrap();
        assert_eq!(named.choice, ToolChoice::Named("get_weather".into()));
        let none = parse_tools(Some(&weather()), Some(&json!("none")), None).unwrap();
        assert!(!none.parses_calls() && none.tools.is_empty());
    }

    #[test]
    fn errors_name_the_field() {
        let param = |tools: Value, choice: Value| {
            parse_tools(Some(&tools), Some(&choice), None)
                .unwrap_err()
                .param()
        };
        let unknown = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(param(weather(), unknown), Some("tool_choice".into()));
        assert_eq!(
            param(json!([]), json!("required")),
            Some("tool_choice".into())
        );
        let twice = json!([{"type": "function", "function": {"name": "a"}},
                           {"type": "function", "function": {"name": "a"}}]);
        assert_eq!(
            param(twice, json!("auto")),
            Some("tools[1].function.name".into())
        );
        let bad = json!([{"type": "function", "function": {"name": "a b"}}]);
        assert_eq!(
            param(bad, json!("auto")),
            Some("tools[0].function.name".into())
        );
    }

    #[test]
    fn a_long_list_finds_its_duplicate() {
        let mut list: Vec<Value> = (0..70_000)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        list.push(json!({"type": "function", "function": {"name": "f69999"}}));
        let error = parse_tools(Some(&Value::Array(list)), None, None).unwrap_err();
        assert_eq!(error.param(), Some("tools[70000].function.name".into()));
    }
}
