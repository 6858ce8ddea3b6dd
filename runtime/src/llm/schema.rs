//! Structured output: the JSON Schema a stage asks its answer to fit. The
//! host checks every answer against it before the journal records it, and
//! the built-in backend samples a random value that fits it, so structured
//! stages run offline.
//!
//! Sampling covers what serde types' schemas (as schemars writes them) use:
//! objects with `properties`, `required` and `additionalProperties`, arrays
//! with `items` and bounds, strings with length bounds and common formats,
//! integers and numbers with bounds, booleans, `null`, `enum`, `const`,
//! `oneOf`/`anyOf`/`allOf`, type lists (nullable types) and local `$ref`s
//! into `$defs`/`definitions`. What it cannot fit (a `pattern`, say) it
//! says, and the call is refused.

use rand::seq::IndexedRandom;
use rand::{Rng, RngExt};
use serde_json::{Map, Value, json};

/// Deepest nesting sampled; past it only what is required is generated.
const MAX_DEPTH: usize = 12;
/// Most values sampled for one answer (a hostile schema cannot make the
/// host build a huge one).
const MAX_NODES: usize = 10_000;
/// Samples tried before giving up on a schema.
const TRIES: usize = 16;
/// Longest schema a stage may send, in bytes of JSON text.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// A compiled schema, compared and digested as its JSON value.
#[derive(Clone)]
pub struct Schema {
    value: Value,
    validator: std::sync::Arc<jsonschema::Validator>,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Schema({})", self.value)
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl serde::Serialize for Schema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl Schema {
    /// Parses and compiles a schema given as JSON text; the error says what
    /// is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_SCHEMA_BYTES {
            return Err(format!(
                "the schema is {} bytes; a schema is at most {MAX_SCHEMA_BYTES}",
                text.len()
            ));
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("the schema is not JSON: {e}"))?;
        Self::new(value)
    }

    pub fn new(value: Value) -> Result<Self, String> {
        let validator = jsonschema::validator_for(&value)
            .map_err(|e| format!("the schema is not a valid JSON Schema: {e}"))?;
        Ok(Self {
            value,
            validator: std::sync::Arc::new(validator),
        })
    }

    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The answer as JSON that fits, or the first reason it does not.
    pub fn check(&self, answer: &str) -> Result<Value, String> {
        let value: Value =
            serde_json::from_str(answer).map_err(|e| format!("the answer is not JSON: {e}"))?;
        let misfit = self.validator.iter_errors(&value).next().map(|e| {
            format!(
                "the answer does not fit the schema at `{}`: {}",
                e.instance_path(),
                crate::text::bounded(&e.to_string(), 200)
            )
        });
        match misfit {
            None => Ok(value),
            Some(why) => Err(why),
        }
    }

    /// A random value that fits, or why none could be made.
    pub fn sample(&self, rng: &mut impl Rng) -> Result<Value, String> {
        let mut last = String::from("no value was tried");
        for _ in 0..TRIES {
            let mut sampler = Sampler {
                root: &self.value,
                nodes: 0,
            };
            match sampler.value(&self.value, rng, 0) {
                Ok(v) if self.validator.is_valid(&v) => return Ok(v),
                Ok(v) => {
                    last = match self.validator.iter_errors(&v).next() {
                        Some(e) => format!("at `{}`: {e}", e.instance_path()),
                        None => "it did not fit".into(),
                    }
                }
                Err(e) => last = e,
            }
        }
        Err(format!(
            "the built-in model cannot produce a value for this schema ({})",
            crate::text::bounded(&last, 200)
        ))
    }
}

struct Sampler<'a> {
    root: &'a Value,
    nodes: usize,
}

impl<'a> Sampler<'a> {
    fn value(&mut self, schema: &Value, rng: &mut impl Rng, depth: usize) -> Result<Value, String> {
        self.nodes += 1;
        if self.nodes > MAX_NODES || depth > 2 * MAX_DEPTH {
            return Err("the schema asks for a value too large to sample".into());
        }
        let schema = match schema {
            Value::Bool(true) => return Ok(Value::Null),
            Value::Bool(false) => return Err("the schema `false` admits no value".into()),
            Value::Object(map) => map,
            _ => return Err("a schema must be an object or a boolean".into()),
        };
        if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
            return self.value(self.resolve(target)?, rng, depth + 1);
        }
        if let Some(c) = schema.get("const") {
            return Ok(c.clone());
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array) {
            return options
                .choose(rng)
                .cloned()
                .ok_or_else(|| "an empty `enum` admits no value".into());
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(branches) = schema.get(key).and_then(Value::as_array) {
                let branch = branches
                    .choose(rng)
                    .ok_or_else(|| format!("an empty `{key}` admits no value"))?;
                return self.value(branch, rng, depth + 1);
            }
        }
        if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
            return self.value(&merged(schema, all), rng, depth + 1);
        }
        let ty = match schema.get("type") {
            Some(Value::String(t)) => t.as_str(),
            Some(Value::Array(types)) => {
                let names: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
                // Deep down, a nullable value ends the recursion.
                if depth >= MAX_DEPTH && names.contains(&"null") {
                    "null"
                } else {
                    names.choose(rng).copied().unwrap_or("null")
                }
            }
            _ if schema.contains_key("properties") => "object",
            _ if schema.contains_key("items") => "array",
            _ => "null",
        };
        match ty {
            "null" => Ok(Value::Null),
            "boolean" => Ok(Value::Bool(rng.random())),
            "integer" => integer(schema, rng),
            "number" => number(schema, rng),
            "string" => string(schema, rng),
            "array" => self.array(schema, rng, depth),
            "object" => self.object(schema, rng, depth),
            other => Err(format!("unknown type `{other}`")),
        }
    }

    /// A local reference: `#` or a JSON pointer into this schema.
    fn resolve(&self, target: &str) -> Result<&'a Value, String> {
        let pointer = target.strip_prefix('#').ok_or_else(|| {
            format!("`$ref` `{target}` is not local; only `#/...` references are sampled")
        })?;
        self.root
            .pointer(pointer)
            .ok_or_else(|| format!("`$ref` `{target}` points at nothing"))
    }

    fn array(
        &mut self,
        schema: &Map<String, Value>,
        rng: &mut impl Rng,
        depth: usize,
    ) -> Result<Value, String> {
        let min = bound(schema, "minItems").unwrap_or(0);
        let max = bound(schema, "maxItems").unwrap_or(min.max(3)).max(min);
        let max = if depth >= MAX_DEPTH {
            min
        } else {
            max.min(min + 5)
        };
        let len = rng.random_range(min..=max);
        let items = schema.get("items").unwrap_or(&Value::Bool(true));
        let unique = schema.get("uniqueItems") == Some(&Value::Bool(true));
        let mut out: Vec<Value> = Vec::with_capacity(len as usize);
        let mut tries = 0;
        while (out.len() as u64) < len {
            let v = self.value(items, rng, depth + 1)?;
            if unique && out.contains(&v) {
                tries += 1;
                if tries > 64 {
                    return Err("cannot sample enough unique items".into());
                }
                continue;
            }
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn object(
        &mut self,
        schema: &Map<String, Value>,
        rng: &mut impl Rng,
        depth: usize,
    ) -> Result<Value, String> {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut out = Map::new();
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                let wanted = required.contains(&name.as_str())
                    || (depth < MAX_DEPTH && rng.random_bool(0.5));
                if wanted {
                    out.insert(name.clone(), self.value(property, rng, depth + 1)?);
                }
            }
        }
        for name in required {
            if !out.contains_key(name) {
                // Required but not described: anything goes unless
                // `additionalProperties` says what.
                let extra = schema
                    .get("additionalProperties")
                    .unwrap_or(&Value::Bool(true));
                out.insert(name.to_string(), self.value(extra, rng, depth + 1)?);
            }
        }
        Ok(Value::Object(out))
    }
}

/// `allOf` folded into one schema: its parts' keywords, the parent's
/// winning, properties and requirements combined.
fn merged(parent: &Map<String, Value>, parts: &[Value]) -> Value {
    let mut out = Map::new();
    let mut properties = Map::new();
    let mut required = Vec::new();
    for part in parts.iter().filter_map(Value::as_object).chain([parent]) {
        for (key, value) in part {
            match key.as_str() {
                "allOf" => {}
                "properties" => properties.extend(value.as_object().cloned().unwrap_or_default()),
                "required" => required.extend(value.as_array().cloned().unwrap_or_default()),
                _ => {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
    }
    if !properties.is_empty() {
        out.insert("properties".into(), Value::Object(properties));
    }
    if !required.is_empty() {
        out.insert("required".into(), Value::Array(required));
    }
    Value::Object(out)
}

fn bound(schema: &Map<String, Value>, key: &str) -> Option<u64> {
    schema.get(key).and_then(Value::as_u64)
}

fn integer(schema: &Map<String, Value>, rng: &mut impl Rng) -> Result<Value, String> {
    let number = |key: &str| schema.get(key).and_then(Value::as_f64);
    let mut low = number("minimum").map_or(-1000.0, f64::ceil);
    let mut high = number("maximum").map_or(low.max(0.0) + 1000.0, f64::floor);
    if let Some(x) = number("exclusiveMinimum") {
        low = low.max(x.floor() + 1.0);
    }
    if let Some(x) = number("exclusiveMaximum") {
        high = high.min(x.ceil() - 1.0);
    }
    // Unsigned formats (schemars' `uint32` and the like).
    if schema
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| f.starts_with("uint"))
    {
        low = low.max(0.0);
    }
    if low > high {
        return Err(format!("no integer lies between {low} and {high}"));
    }
    let (low, high) = (low.max(-1e15) as i64, high.min(1e15) as i64);
    let span_high = high.min(low.saturating_add(1000));
    Ok(json!(rng.random_range(low..=span_high.max(low))))
}

fn number(schema: &Map<String, Value>, rng: &mut impl Rng) -> Result<Value, String> {
    let number = |key: &str| schema.get(key).and_then(Value::as_f64);
    let low = number("minimum")
        .or(number("exclusiveMinimum"))
        .unwrap_or(-1000.0);
    let high = number("maximum")
        .or(number("exclusiveMaximum"))
        .unwrap_or(low.max(0.0) + 1000.0);
    if !(low < high || (low == high && number("exclusiveMinimum").is_none())) {
        return Err(format!("no number lies between {low} and {high}"));
    }
    let x = if low == high {
        low
    } else {
        low + (high - low) * rng.random_range(0.01..0.99)
    };
    Ok(json!(x))
}

const WORDS: [&str; 12] = [
    "ratchet",
    "durable",
    "stage",
    "canonical",
    "journal",
    "replay",
    "lease",
    "outbox",
    "artifact",
    "pipeline",
    "model",
    "answer",
];

fn string(schema: &Map<String, Value>, rng: &mut impl Rng) -> Result<Value, String> {
    if schema.contains_key("pattern") {
        return Err("a string `pattern` cannot be sampled".into());
    }
    let format = schema.get("format").and_then(Value::as_str).unwrap_or("");
    let fixed = match format {
        "date-time" => Some(format!(
            "2026-{:02}-{:02}T12:00:00Z",
            rng.random_range(1..=12),
            rng.random_range(1..=28)
        )),
        "date" => Some(format!(
            "2026-{:02}-{:02}",
            rng.random_range(1..=12),
            rng.random_range(1..=28)
        )),
        "time" => Some(format!(
            "{:02}:{:02}:00Z",
            rng.random_range(0..24),
            rng.random_range(0..60)
        )),
        "email" => Some(format!(
            "{}@example.com",
            WORDS.choose(rng).unwrap_or(&"user")
        )),
        "uri" | "url" => Some(format!(
            "https://example.com/{}",
            WORDS.choose(rng).unwrap_or(&"page")
        )),
        "uuid" => Some(format!(
            "{:08x}-0000-4000-8000-{:012x}",
            rng.random::<u32>(),
            rng.random::<u64>() & 0xffff_ffff_ffff
        )),
        _ => None,
    };
    if let Some(text) = fixed {
        return Ok(Value::String(text));
    }
    let min = bound(schema, "minLength").unwrap_or(0) as usize;
    let max = bound(schema, "maxLength")
        .map_or(min.max(40), |m| m as usize)
        .max(min);
    let mut text = String::new();
    let goal = rng.random_range(min.max(1).min(max)..=max.min(min + 60));
    while text.chars().count() < goal {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS.choose(rng).unwrap_or(&"word"));
    }
    let text: String = text.chars().take(goal).collect();
    Ok(Value::String(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn fits(schema: Value) {
        let schema = Schema::new(schema).expect("valid schema");
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..50 {
            let v = schema.sample(&mut rng).expect("a value");
            assert!(
                schema.check(&v.to_string()).is_ok(),
                "{v} does not fit {:?}",
                schema
            );
        }
    }

    /// What schemars writes for ordinary serde types. Seen failing with
    /// `$ref` unresolved and with `exclusiveMinimum` ignored.
    #[test]
    fn samples_fit_what_serde_types_describe() {
        fits(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Summary",
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 3, "maxLength": 12},
                "score": {"type": "integer", "format": "uint8", "minimum": 0, "maximum": 255},
                "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "done": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4, "uniqueItems": true},
                "mood": {"type": "string", "enum": ["calm", "bold"]},
                "kind": {"const": "summary"},
                "note": {"type": ["string", "null"]},
                "source": {"$ref": "#/$defs/Source"},
                "shape": {"oneOf": [
                    {"type": "object", "properties": {"circle": {"type": "number", "minimum": 0}}, "required": ["circle"], "additionalProperties": false},
                    {"type": "string", "enum": ["square"]}
                ]},
                "tree": {"$ref": "#/$defs/Tree"}
            },
            "required": ["title", "score", "ratio", "done", "tags", "mood", "kind", "source", "shape"],
            "additionalProperties": false,
            "$defs": {
                "Source": {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}, "seen": {"type": "string", "format": "date"}}, "required": ["url"]},
                "Tree": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}}, "required": ["children"]}
            }
        }));
    }

    #[test]
    fn a_schema_nothing_fits_is_said() {
        let schema =
            Schema::new(json!({"type": "integer", "minimum": 5, "maximum": 4})).expect("valid");
        let err = schema
            .sample(&mut StdRng::seed_from_u64(1))
            .expect_err("no value");
        assert!(err.contains("cannot produce"), "{err}");
        let err = Schema::parse("{\"type\": 5}").expect_err("invalid schema");
        assert!(err.contains("not a valid JSON Schema"), "{err}");
        let err = Schema::parse("not json").expect_err("not JSON");
        assert!(err.contains("not JSON"), "{err}");
        let huge = format!("{{\"description\": \"{}\"}}", "x".repeat(MAX_SCHEMA_BYTES));
        let err = Schema::parse(&huge).expect_err("too long");
        assert!(err.contains("at most 65536"), "{err}");
    }

    /// Seen failing with `check` returning Ok for any JSON.
    #[test]
    fn an_answer_that_does_not_fit_is_refused_with_where() {
        let schema = Schema::new(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        )
        .expect("valid");
        assert!(schema.check("{\"n\": 3}").is_ok());
        let err = schema.check("{\"n\": \"three\"}").expect_err("a string");
        assert!(err.contains("/n"), "{err}");
        assert!(schema.check("{}").is_err());
        assert!(
            schema
                .check("three")
                .expect_err("not JSON")
                .contains("not JSON")
        );
    }
}
