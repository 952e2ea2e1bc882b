//! The seam's [`Constraint`] as an llguidance grammar.
//!
//! JSON is generated compact-ish (`", "` and `": "`, no free whitespace):
//! with flexible whitespace a sampled model can emit newlines forever and
//! never close the object, and the separators match what models were
//! trained on. A schema that sets its own `x-guidance` options keeps them.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};
use switchyard_seam::{Constraint, Tool, TOOL_CALL_CLOSE, TOOL_CALL_OPEN};

use super::limits::SchemaBudget;

/// A constraint that cannot become a grammar, and the request field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarError {
    /// The request field to name in the 400.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// The grammar that enforces `constraint`; `tools` are the request's, which
/// a [`Constraint::ToolCalls`] names. Every schema is checked against
/// [`super::limits`] here, before llguidance sees it.
pub fn grammar(constraint: &Constraint, tools: &[Tool]) -> Result<TopLevelGrammar, GrammarError> {
    let mut budget = SchemaBudget::default();
    match constraint {
        Constraint::JsonObject => Ok(TopLevelGrammar::from_json_schema(with_layout(
            json!({"type": "object"}),
        ))),
        Constraint::JsonSchema { schema, field } => {
            let schema = parse_schema(schema, field, &mut budget)?;
            Ok(TopLevelGrammar::from_json_schema(with_layout(schema)))
        }
        Constraint::ToolCalls { names, parallel } => {
            tool_calls(names, *parallel, tools, &mut budget).map(TopLevelGrammar::from_lark)
        }
    }
}

/// One call (or calls separated by newlines) of the named tools:
/// `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`.
fn tool_calls(
    names: &[String],
    parallel: bool,
    tools: &[Tool],
    budget: &mut SchemaBudget,
) -> Result<String, GrammarError> {
    // By name, so that a call naming every tool of a long list stays linear;
    // reversed, so that the first of two tools of one name is the one kept.
    let by_name: std::collections::HashMap<&str, (usize, &Tool)> = tools
        .iter()
        .enumerate()
        .rev()
        .map(|(i, tool)| (tool.name.as_str(), (i, tool)))
        .collect();
    let mut alternatives = Vec::with_capacity(names.len());
    for name in names {
        let Some(&(i, tool)) = by_name.get(name.as_str()) else {
            return Err(GrammarError {
                field: "tool_choice".to_owned(),
                message: format!("no tool named '{name}' is in 'tools'"),
            });
        };
        let field = format!("tools[{i}].function.parameters");
        let parameters = parse_schema(&tool.parameters, &field, budget)?;
        alternatives.push(json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    if alternatives.is_empty() {
        return Err(GrammarError {
            field: "tools".to_owned(),
            message: "no tools were given to call; send at least one tool".to_owned(),
        });
    }
    let call = with_layout(json!({"anyOf": alternatives}));
    let open = lark_string(&format!("{TOOL_CALL_OPEN}\n"));
    let close = lark_string(&format!("\n{TOOL_CALL_CLOSE}"));
    let start = if parallel {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    };
    Ok(format!("{start}\ncall: {open} %json {call} {close}\n"))
}

/// `text` as a Lark string literal.
fn lark_string(text: &str) -> String {
    // JSON string escaping is a subset Lark reads back the same.
    Value::String(text.to_owned()).to_string()
}

fn parse_schema(text: &str, field: &str, budget: &mut SchemaBudget) -> Result<Value, GrammarError> {
    let error = |message: String| GrammarError {
        field: field.to_owned(),
        message,
    };
    match serde_json::from_str::<Value>(text) {
        Ok(schema @ Value::Object(_)) => {
            budget
                .charge(&schema)
                .map_err(|exceeded| error(exceeded.to_string()))?;
            Ok(schema)
        }
        Ok(Value::Bool(true)) => Ok(json!({})),
        Ok(other) => Err(error(format!(
            "a JSON schema must be an object, found {other}"
        ))),
        Err(e) => Err(error(format!("the schema is not valid JSON: {e}"))),
    }
}

/// `schema` with Switchyard's JSON layout, unless it chose its own.
fn with_layout(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(|| {
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, parameters: &str) -> Tool {
        Tool {
            name: name.to_owned(),
            description: None,
            parameters: parameters.to_owned(),
        }
    }

    #[test]
    fn tool_calls_name_the_missing_tool_and_the_bad_schema() {
        let tools = [tool("a", "{}"), tool("b", "[1]")];
        let missing = Constraint::ToolCalls {
            names: vec!["c".into()],
            parallel: false,
        };
        assert_eq!(grammar(&missing, &tools).unwrap_err().field, "tool_choice");
        let bad = Constraint::ToolCalls {
            names: vec!["a".into(), "b".into()],
            parallel: true,
        };
        assert_eq!(
            grammar(&bad, &tools).unwrap_err().field,
            "tools[1].function.parameters"
        );
    }

    #[test]
    fn schema_errors_name_their_field() {
        let constraint = Constraint::JsonSchema {
            schema: "{\"type\": ".into(),
            field: "response_format.json_schema.schema".into(),
        };
        let error = grammar(&constraint, &[]).unwrap_err();
        assert_eq!(error.field, "response_format.json_schema.schema");
        assert!(
            error.message.contains("not valid JSON"),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_schema_keeps_its_own_layout() {
        let schema = with_layout(json!({"x-guidance": {"whitespace_flexible": true}}));
        assert_eq!(schema["x-guidance"], json!({"whitespace_flexible": true}));
        let schema = with_layout(json!({"type": "object"}));
        assert_eq!(schema["x-guidance"]["whitespace_flexible"], json!(false));
    }

    #[test]
    fn schemas_past_the_limits_are_refused_naming_the_limit() {
        let mut defs = serde_json::Map::new();
        for i in 0..600 {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert("d600".into(), json!({"type": "integer"}));
        let chain = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        let constraint = Constraint::JsonSchema {
            schema: chain.to_string(),
            field: "response_format.json_schema.schema".into(),
        };
        let error = grammar(&constraint, &[]).unwrap_err();
        assert_eq!(error.field, "response_format.json_schema.schema");
        assert!(
            error.message.contains("$ref chain length"),
            "{}",
            error.message
        );
        // Tools share one budget: each alone fits, together they do not.
        let wide: serde_json::Map<String, Value> =
            (0..3000).map(|i| (format!("p{i}"), json!({}))).collect();
        let parameters = json!({"type": "object", "properties": wide}).to_string();
        let tools = [tool("a", &parameters), tool("b", &parameters)];
        let both = Constraint::ToolCalls {
            names: vec!["a".into(), "b".into()],
            parallel: false,
        };
        let error = grammar(&both, &tools).unwrap_err();
        assert_eq!(error.field, "tools[1].function.parameters");
        assert!(
            error.message.contains("object properties"),
            "{}",
            error.message
        );
    }
}
