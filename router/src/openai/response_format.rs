//! `response_format`: free text, any JSON object, or JSON that validates
//! against a schema. The schema itself is compiled by the engine, which
//! refuses what it cannot enforce with the keyword named.

use serde_json::Value;

use crate::error::ApiError;
use crate::openai::params::{describe, invalid};
use switchyard_seam::Constraint;

/// Where a `json_schema` format keeps its schema, for errors.
pub const SCHEMA_FIELD: &str = "response_format.json_schema.schema";

/// The constraint `response_format` asks for; `None` for free text.
pub fn parse_response_format(format: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    let format = match format {
        None | Some(Value::Null) => return Ok(None),
        Some(format @ Value::Object(_)) => format,
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: "response_format".to_owned(),
                detail: format!(
                    "expected an object like {{\"type\": \"json_object\"}}, found {}",
                    describe(other)
                ),
            })
        }
    };
    match format.get("type").and_then(Value::as_str) {
        None => Err(ApiError::MissingParameter {
            param: "response_format.type".to_owned(),
        }),
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let Some(json_schema) = format.get("json_schema") else {
                return Err(ApiError::MissingParameter {
                    param: "response_format.json_schema".to_owned(),
                });
            };
            match json_schema.get("schema") {
                None | Some(Value::Null) => Err(ApiError::MissingParameter {
                    param: SCHEMA_FIELD.to_owned(),
                }),
                Some(schema @ (Value::Object(_) | Value::Bool(true))) => {
                    Ok(Some(Constraint::JsonSchema {
                        schema: schema.to_string(),
                        field: SCHEMA_FIELD.to_owned(),
                    }))
                }
                Some(other) => Err(ApiError::InvalidType {
                    param: SCHEMA_FIELD.to_owned(),
                    detail: format!("expected a JSON schema object, found {}", describe(other)),
                }),
            }
        }
        Some(other) => Err(invalid(
            "response_format.type",
            format!(
                "'{other}' is not a response format; use 'text', 'json_object' or 'json_schema'."
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_become_constraints() {
        assert_eq!(parse_response_format(None).unwrap(), None);
        assert_eq!(
            parse_response_format(Some(&json!({"type": "text"}))).unwrap(),
            None
        );
        assert_eq!(
            parse_response_format(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(Constraint::JsonObject)
        );
        let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
            "schema": {"type": "object"}}});
        assert_eq!(
            parse_response_format(Some(&schema)).unwrap(),
            Some(Constraint::JsonSchema {
                schema: "{\"type\":\"object\"}".into(),
                field: SCHEMA_FIELD.into()
            })
        );
    }

    #[test]
    fn bad_formats_name_the_field() {
        let param = |value: Value| parse_response_format(Some(&value)).unwrap_err().param();
        assert_eq!(
            param(json!({"type": "xml"})),
            Some("response_format.type".into())
        );
        assert_eq!(
            param(json!({"type": "json_schema"})),
            Some("response_format.json_schema".into())
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"schema": 3}})),
            Some(SCHEMA_FIELD.into())
        );
    }
}
