//! The size a schema may have before llguidance sees it.
//!
//! llguidance compiles a schema recursively, once per nesting level, per
//! `$ref` followed and per property, and its own limits (grammar size, lexer
//! fuel) apply only after that recursion: a 20 KB chain of 600 `$ref`s or an
//! object of 7,000 properties overflowed a 2 MiB stack and aborted the
//! process. These limits are checked first, without recursion, and bound how
//! deep the compile can go; the compile thread's stack (see
//! [`super::pool`]) is sized for the largest schema they accept. The
//! property and node limits follow OpenAI's for structured outputs.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Nesting levels of one schema document (objects and arrays inside each other).
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// `$ref`s followed one after another from a schema's root (the longest chain).
pub const MAX_REF_CHAIN: usize = 64;
/// Object properties over every schema of a request.
pub const MAX_PROPERTIES: usize = 5_000;
/// JSON values (objects, arrays, strings, numbers...) over every schema of a request.
pub const MAX_SCHEMA_NODES: usize = 100_000;

/// A schema past one of the limits: which one, the limit and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitExceeded {
    /// The limit's name as the error message gives it.
    pub limit: &'static str,
    /// Its value.
    pub max: usize,
    /// What the schema reached (a lower bound: the walk stops at the limit).
    pub found: usize,
}

impl std::fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the schema exceeds the {} limit of {} (found at least {})",
            self.limit, self.max, self.found
        )
    }
}

/// What one request's schemas have used of the shared limits (properties,
/// nodes); depth and `$ref` chain are per schema.
#[derive(Debug, Default)]
pub struct SchemaBudget {
    properties: usize,
    nodes: usize,
}

impl SchemaBudget {
    /// Checks `schema` against the limits, counting its properties and nodes
    /// toward this request's totals.
    pub fn charge(&mut self, schema: &Value) -> Result<(), LimitExceeded> {
        let mut refs = Vec::new();
        // An explicit stack: the walk must not itself recurse per level.
        let mut stack = vec![(schema, 1usize)];
        while let Some((value, depth)) = stack.pop() {
            self.nodes += 1;
            exceeds("total schema nodes", MAX_SCHEMA_NODES, self.nodes)?;
            exceeds("schema depth", MAX_SCHEMA_DEPTH, depth)?;
            match value {
                Value::Object(map) => {
                    if let Some(Value::Object(properties)) = map.get("properties") {
                        self.properties += properties.len();
                        exceeds("object properties", MAX_PROPERTIES, self.properties)?;
                    }
                    if let Some(Value::String(target)) = map.get("$ref") {
                        refs.push(target.as_str());
                    }
                    stack.extend(map.values().map(|v| (v, depth + 1)));
                }
                Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
                _ => {}
            }
        }
        if !refs.is_empty() {
            let chain = longest_ref_chain(schema);
            exceeds("$ref chain length", MAX_REF_CHAIN, chain)?;
        }
        Ok(())
    }
}

fn exceeds(limit: &'static str, max: usize, found: usize) -> Result<(), LimitExceeded> {
    if found > max {
        Err(LimitExceeded { limit, max, found })
    } else {
        Ok(())
    }
}

/// The most `$ref`s followed one after another from the root, each local
/// reference (`#/...`) to the subschema it points to. A cycle (a recursive
/// schema, which llguidance compiles once per name) ends a chain.
fn longest_ref_chain(root: &Value) -> usize {
    // Every subschema a reference points to, and the references inside it.
    let mut edges: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut pending = vec!["#"];
    while let Some(target) = pending.pop() {
        if edges.contains_key(target) {
            continue;
        }
        let inside = resolve(root, target).map(refs_inside).unwrap_or_default();
        pending.extend(inside.iter().copied());
        edges.insert(target, inside);
    }
    // Longest path by an iterative depth-first walk; a reference back onto the
    // current path (a cycle) counts nothing.
    let mut longest: HashMap<&str, usize> = HashMap::new();
    let mut on_path: HashSet<&str> = HashSet::new();
    let mut stack: Vec<(&str, usize)> = vec![("#", 0)];
    on_path.insert("#");
    while let Some(&mut (node, ref mut next)) = stack.last_mut() {
        let children = edges.get(node).map_or(&[][..], Vec::as_slice);
        if let Some(&child) = children.get(*next) {
            *next += 1;
            if !longest.contains_key(child) && on_path.insert(child) {
                stack.push((child, 0));
            }
            continue;
        }
        // Every child is now done, or on the path: a cycle, followed once.
        let best = children
            .iter()
            .map(|child| longest.get(child).map_or(1, |length| length + 1))
            .max()
            .unwrap_or(0);
        longest.insert(node, best);
        on_path.remove(node);
        stack.pop();
    }
    longest.get("#").copied().unwrap_or(0)
}

/// Every local `$ref` inside `schema`.
fn refs_inside(schema: &Value) -> Vec<&str> {
    let mut found = Vec::new();
    let mut stack = vec![schema];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    if target.starts_with('#') {
                        found.push(target.as_str());
                    }
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    found
}

/// The subschema `#/a/b` points to in `root` (a JSON pointer after the `#`).
fn resolve<'a>(root: &'a Value, target: &str) -> Option<&'a Value> {
    let pointer = target.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `{"$defs": {"d0": {"$ref": "#/$defs/d1"}, ..., "dN": {"type": "integer"}},
    /// "$ref": "#/$defs/d0"}`: a chain of `links + 1` references.
    pub(crate) fn ref_chain(links: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..links {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert(format!("d{links}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    fn nested(depth: usize) -> Value {
        let mut schema = json!({"type": "integer"});
        for _ in 0..depth {
            schema = json!({"type": "object", "properties": {"a": schema}});
        }
        schema
    }

    fn charge(schema: &Value) -> Result<(), LimitExceeded> {
        SchemaBudget::default().charge(schema)
    }

    #[test]
    fn a_ref_chain_is_measured_and_refused_past_the_limit() {
        assert_eq!(longest_ref_chain(&ref_chain(10)), 11);
        assert_eq!(charge(&ref_chain(MAX_REF_CHAIN - 1)), Ok(()));
        let error = charge(&ref_chain(600)).unwrap_err();
        assert_eq!(error.limit, "$ref chain length");
        assert!(error.to_string().contains("limit of 64"), "{error}");
    }

    #[test]
    fn recursive_schemas_are_accepted() {
        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"
        });
        assert_eq!(charge(&tree), Ok(()));
        let mutual = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                            "$ref": "#/$defs/a"});
        assert_eq!(charge(&mutual), Ok(()));
    }

    #[test]
    fn depth_properties_and_nodes_are_limited() {
        // Each nesting level of `nested` is two JSON levels (schema, properties).
        assert_eq!(charge(&nested(MAX_SCHEMA_DEPTH / 2 - 1)), Ok(()));
        assert_eq!(charge(&nested(200)).unwrap_err().limit, "schema depth");
        let wide: serde_json::Map<String, Value> = (0..MAX_PROPERTIES + 1)
            .map(|i| (format!("p{i}"), json!({"type": "integer"})))
            .collect();
        let error = charge(&json!({"type": "object", "properties": wide})).unwrap_err();
        assert_eq!(error.limit, "object properties");
        let long = Value::Array(vec![json!(1); MAX_SCHEMA_NODES]);
        assert_eq!(
            charge(&json!({"enum": long})).unwrap_err().limit,
            "total schema nodes"
        );
    }

    #[test]
    fn the_budget_is_shared_by_a_requests_schemas() {
        let half: serde_json::Map<String, Value> = (0..MAX_PROPERTIES / 2 + 1)
            .map(|i| (format!("p{i}"), json!({})))
            .collect();
        let schema = json!({"properties": half});
        let mut budget = SchemaBudget::default();
        assert_eq!(budget.charge(&schema), Ok(()));
        assert_eq!(
            budget.charge(&schema).unwrap_err().limit,
            "object properties"
        );
    }
}
