//! Structured outputs: a short request with `response_format: json_schema`, one of ten schemas
//! (nested objects, enums, arrays, numbers with bounds, required keys) in turn. The answer passes
//! when its content parses as JSON and validates against the schema. Unconstrained, the same
//! prompt goes without `response_format` (the decode rate without a grammar; the score says what
//! the model writes unasked).

use serde_json::{json, Value};

use super::{Check, Job, JobSource};
use crate::client::Api;
use crate::error::Result;
use crate::request;

/// Output tokens each answer may take (every schema's answers fit well within it).
const MAX_TOKENS: usize = 200;

/// (prompt, schema).
fn cases() -> Vec<(&'static str, Value)> {
    let name = json!({"type": "string", "maxLength": 30});
    vec![
        (
            "Describe a dog as JSON.",
            json!({"type": "object", "properties": {
                "name": name, "breed": name,
                "age": {"type": "integer", "minimum": 0, "maximum": 25}},
                "required": ["name", "breed", "age"]}),
        ),
        (
            "Give the capital and population of Japan as JSON.",
            json!({"type": "object", "properties": {
                "country": name, "capital": name,
                "population_millions": {"type": "number", "minimum": 0, "maximum": 2000}},
                "required": ["country", "capital", "population_millions"]}),
        ),
        (
            "List four colors of the rainbow as JSON.",
            json!({"type": "object", "properties": {
                "colors": {"type": "array", "minItems": 4, "maxItems": 4,
                    "items": {"enum": ["red", "orange", "yellow", "green", "blue",
                                       "indigo", "violet"]}}},
                "required": ["colors"]}),
        ),
        (
            "Describe a company and its founder as JSON.",
            json!({"type": "object", "properties": {
                "company": name,
                "founder": {"type": "object", "properties": {
                    "name": name, "born": {"type": "integer", "minimum": 1800, "maximum": 2010}},
                    "required": ["name", "born"]},
                "public": {"type": "boolean"}},
                "required": ["company", "founder", "public"]}),
        ),
        (
            "Classify this email as JSON: You won a free cruise, click here!",
            json!({"type": "object", "properties": {
                "label": {"enum": ["spam", "not_spam"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
                "required": ["label", "confidence"]}),
        ),
        (
            "Plan a three-step morning routine as JSON.",
            json!({"type": "object", "properties": {
                "steps": {"type": "array", "minItems": 3, "maxItems": 3, "items": {
                    "type": "object", "properties": {
                        "action": {"type": "string", "maxLength": 40},
                        "minutes": {"type": "integer", "minimum": 1, "maximum": 60}},
                    "required": ["action", "minutes"]}}},
                "required": ["steps"]}),
        ),
        (
            "Give a recipe name and two ingredients with amounts in grams as JSON.",
            json!({"type": "object", "properties": {
                "recipe": name,
                "ingredients": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
                    "type": "object", "properties": {
                        "item": name, "grams": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    "required": ["item", "grams"]}}},
                "required": ["recipe", "ingredients"]}),
        ),
        (
            "Report a server's status as JSON.",
            json!({"type": "object", "properties": {
                "host": name,
                "status": {"enum": ["up", "down", "degraded"]},
                "cpu_percent": {"type": "number", "minimum": 0, "maximum": 100},
                "disks": {"type": "array", "maxItems": 3, "items": {"type": "string",
                                                                     "maxLength": 10}}},
                "required": ["host", "status", "cpu_percent"]}),
        ),
        (
            "Describe a flight as JSON.",
            json!({"type": "object", "properties": {
                "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "stops": {"type": "integer", "minimum": 0, "maximum": 3},
                "class": {"enum": ["economy", "business", "first"]}},
                "required": ["from", "to", "stops", "class"]}),
        ),
        (
            "Summarize a book review as JSON.",
            json!({"type": "object", "properties": {
                "title": {"type": "string", "maxLength": 40},
                "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                "tags": {"type": "array", "minItems": 1, "maxItems": 3,
                         "items": {"type": "string", "maxLength": 15}},
                "review": {"type": "object", "properties": {
                    "pros": {"type": "string", "maxLength": 60},
                    "cons": {"type": "string", "maxLength": 60}},
                    "required": ["pros", "cons"]}},
                "required": ["title", "rating", "tags", "review"]}),
        ),
    ]
}

/// `json_schema` requests, cycling through the schemas.
#[derive(Debug, Clone)]
pub struct JsonJobs {
    pub model: String,
    /// Without it, the same prompts go without `response_format`.
    pub constrained: bool,
}

impl JobSource for JsonJobs {
    fn job(&self, n: u64) -> Result<Job> {
        let cases = cases();
        let (prompt, schema) = cases[n as usize % cases.len()].clone();
        let extra = if self.constrained {
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": true}}})
        } else {
            json!({})
        };
        Ok(Job {
            api: Api::Chat,
            body: request::chat(&self.model, prompt, MAX_TOKENS, extra),
            check: Check::Json { schema },
            kind: if self.constrained {
                "json_schema".into()
            } else {
                "json-free".into()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_compiles_and_requests_carry_it_only_when_constrained() {
        for (_, schema) in cases() {
            jsonschema::validator_for(&schema).expect("a valid schema");
        }
        let jobs = |constrained| JsonJobs {
            model: "m".into(),
            constrained,
        };
        let body = |j: &Job| serde_json::from_slice::<Value>(&j.body).unwrap();
        let on = jobs(true).job(3).unwrap();
        let off = jobs(false).job(3).unwrap();
        assert_eq!(
            body(&on)["response_format"]["json_schema"]["schema"],
            cases()[3].1
        );
        assert!(body(&off).get("response_format").is_none());
        assert_eq!(body(&on)["messages"], body(&off)["messages"]);
        assert_eq!(on.check, off.check);
        assert_ne!(jobs(true).job(0).unwrap().body, on.body);
        assert_eq!(jobs(true).job(13).unwrap().body, on.body);
    }
}
