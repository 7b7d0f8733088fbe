//! The structured-output workloads of issue 21, item 6: 20 schemas with prompts (nested
//! objects, enums, arrays, numbers with bounds, required keys) and 20 tool-call prompts.

use serde_json::{json, Value};

/// (prompt, JSON schema).
pub fn cases() -> Vec<(&'static str, Value)> {
    vec![
        (
            "Describe a person.",
            json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 40},
                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"]}),
        ),
        (
            "Give me the weather in Paris.",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "temperature_c": {"type": "number", "minimum": -50, "maximum": 60},
                "sky": {"enum": ["sunny", "cloudy", "rainy", "snowy"]}},
                "required": ["city", "temperature_c", "sky"]}),
        ),
        (
            "List three fruits.",
            json!({"type": "object", "properties": {
                "fruits": {"type": "array", "items": {"type": "string", "maxLength": 20},
                           "minItems": 3, "maxItems": 3}},
                "required": ["fruits"]}),
        ),
        (
            "Describe a book and its author.",
            json!({"type": "object", "properties": {
                "title": {"type": "string", "maxLength": 60},
                "author": {"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "born": {"type": "integer", "minimum": 1000, "maximum": 2025}},
                    "required": ["name", "born"]},
                "pages": {"type": "integer", "minimum": 1, "maximum": 5000}},
                "required": ["title", "author", "pages"]}),
        ),
        (
            "Rate the movie Titanic.",
            json!({"type": "object", "properties": {
                "movie": {"type": "string", "maxLength": 40},
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                "recommend": {"type": "boolean"}},
                "required": ["movie", "stars", "recommend"]}),
        ),
        (
            "Classify the sentiment of: I love this phone.",
            json!({"type": "object", "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
                "required": ["sentiment", "confidence"]}),
        ),
        (
            "Give me a shopping list with quantities.",
            json!({"type": "object", "properties": {
                "items": {"type": "array", "maxItems": 5, "items": {
                    "type": "object", "properties": {
                        "name": {"type": "string", "maxLength": 20},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 20}},
                    "required": ["name", "quantity"]}}},
                "required": ["items"]}),
        ),
        (
            "What is the capital of Italy?",
            json!({"type": "object", "properties": {
                "country": {"type": "string", "maxLength": 30},
                "capital": {"type": "string", "maxLength": 30}},
                "required": ["country", "capital"]}),
        ),
        (
            "Describe a car.",
            json!({"type": "object", "properties": {
                "make": {"type": "string", "maxLength": 20},
                "year": {"type": "integer", "minimum": 1900, "maximum": 2026},
                "color": {"enum": ["red", "blue", "black", "white", "silver"]},
                "electric": {"type": "boolean"}},
                "required": ["make", "year", "color", "electric"]}),
        ),
        (
            "Give the coordinates of London.",
            json!({"type": "object", "properties": {
                "lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                "required": ["lat", "lon"]}),
        ),
        (
            "Plan a meeting.",
            json!({"type": "object", "properties": {
                "topic": {"type": "string", "maxLength": 50},
                "attendees": {"type": "array", "minItems": 1, "maxItems": 4,
                              "items": {"type": "string", "maxLength": 20}},
                "duration_minutes": {"type": "integer", "minimum": 15, "maximum": 240}},
                "required": ["topic", "attendees", "duration_minutes"]}),
        ),
        (
            "Describe a pet.",
            json!({"type": "object", "properties": {
                "species": {"enum": ["dog", "cat", "bird", "fish"]},
                "name": {"type": "string", "maxLength": 20},
                "age_years": {"type": "integer", "minimum": 0, "maximum": 30}},
                "required": ["species", "name"]}),
        ),
        (
            "Summarize a news story in one line.",
            json!({"type": "object", "properties": {
                "headline": {"type": "string", "maxLength": 80},
                "category": {"enum": ["politics", "sports", "science", "business"]}},
                "required": ["headline", "category"]}),
        ),
        (
            "Create a user account.",
            json!({"type": "object", "properties": {
                "username": {"type": "string", "pattern": "^[a-z]{3,12}$"},
                "roles": {"type": "array", "maxItems": 3,
                          "items": {"enum": ["admin", "editor", "viewer"]}},
                "active": {"type": "boolean"}},
                "required": ["username", "roles", "active"]}),
        ),
        (
            "Give me a recipe.",
            json!({"type": "object", "properties": {
                "dish": {"type": "string", "maxLength": 40},
                "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                "steps": {"type": "array", "minItems": 1, "maxItems": 4,
                          "items": {"type": "string", "maxLength": 60}}},
                "required": ["dish", "servings", "steps"]}),
        ),
        (
            "Describe a company.",
            json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 30},
                "address": {"type": "object", "properties": {
                    "city": {"type": "string", "maxLength": 30},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]},
                "employees": {"type": "integer", "minimum": 1, "maximum": 1000000}},
                "required": ["name", "address", "employees"]}),
        ),
        (
            "Give a temperature reading.",
            json!({"type": "object", "properties": {
                "value": {"type": "number", "exclusiveMinimum": -273.15, "maximum": 1000},
                "unit": {"enum": ["C", "F", "K"]}},
                "required": ["value", "unit"]}),
        ),
        (
            "Score a basketball game.",
            json!({"type": "object", "properties": {
                "home": {"type": "object", "properties": {
                    "team": {"type": "string", "maxLength": 30},
                    "points": {"type": "integer", "minimum": 0, "maximum": 200}},
                    "required": ["team", "points"]},
                "away": {"type": "object", "properties": {
                    "team": {"type": "string", "maxLength": 30},
                    "points": {"type": "integer", "minimum": 0, "maximum": 200}},
                    "required": ["team", "points"]}},
                "required": ["home", "away"]}),
        ),
        (
            "Answer yes or no: is the sky blue?",
            json!({"type": "object", "properties": {
                "answer": {"enum": ["yes", "no"]},
                "reason": {"type": "string", "maxLength": 80}},
                "required": ["answer"]}),
        ),
        (
            "Give me a list of prime numbers.",
            json!({"type": "object", "properties": {
                "primes": {"type": "array", "minItems": 2, "maxItems": 6,
                           "items": {"type": "integer", "minimum": 2, "maximum": 100}}},
                "required": ["primes"]}),
        ),
    ]
}

fn tool(name: &str, description: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {
        "name": name, "description": description, "parameters": parameters}})
}

/// The tools every tool-call prompt is offered.
fn toolbox() -> Value {
    json!([
        tool(
            "get_weather",
            "Current weather for a city",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"]})
        ),
        tool(
            "search_web",
            "Search the web",
            json!({"type": "object", "properties": {
                "query": {"type": "string", "maxLength": 80},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
                "required": ["query"]})
        ),
        tool(
            "send_email",
            "Send an email",
            json!({"type": "object", "properties": {
                "to": {"type": "string", "maxLength": 60},
                "subject": {"type": "string", "maxLength": 60},
                "body": {"type": "string", "maxLength": 200}},
                "required": ["to", "subject"]})
        ),
        tool(
            "set_timer",
            "Start a countdown timer",
            json!({"type": "object", "properties": {
                "minutes": {"type": "integer", "minimum": 1, "maximum": 180}},
                "required": ["minutes"]})
        ),
    ])
}

/// (prompt, tools).
pub fn tool_cases() -> Vec<(&'static str, Value)> {
    [
        "What's the weather in Paris?",
        "Is it raining in London right now?",
        "Tell me the temperature in Tokyo in fahrenheit.",
        "Search the web for the best pizza in Naples.",
        "Find news about the Mars rover.",
        "Look up who won the 2018 World Cup.",
        "Email bob@example.com that the meeting moved to 3pm.",
        "Send an email to alice@example.com with subject Hello.",
        "Write to my boss at boss@example.com that I am sick today.",
        "Set a timer for 10 minutes.",
        "Remind me in 25 minutes.",
        "Start a 5 minute countdown.",
        "How hot is it in Cairo?",
        "Search for a chocolate cake recipe.",
        "What is the weather like in New York today?",
        "Find the population of Canada.",
        "Set a timer for one hour.",
        "Email team@example.com the subject Release done.",
        "Will it snow in Oslo?",
        "Search the web for Rust programming tutorials.",
    ]
    .into_iter()
    .map(|p| (p, toolbox()))
    .collect()
}

/// Prompts for `tool_choice: "auto"` with [`toolbox`]: ten that ask for a call, two for prose.
pub fn auto_prompts() -> Vec<&'static str> {
    vec![
        "Call the function set_timer with minutes 10, inside <tool_call></tool_call> tags.",
        "Call the function get_weather with city Paris, inside <tool_call></tool_call> tags.",
        "Call the function search_web with query pizza in Naples, inside <tool_call></tool_call> tags.",
        "Call the function send_email with to bob@example.com and subject Meeting, inside <tool_call></tool_call> tags.",
        "Call the function get_weather with city Tokyo and unit fahrenheit, inside <tool_call></tool_call> tags.",
        "Start a timer for 25 minutes by calling set_timer within <tool_call> tags.",
        "Find Rust tutorials by calling search_web within <tool_call> tags.",
        "Get the weather in Oslo by calling get_weather within <tool_call> tags.",
        "Email alice@example.com with subject Hello by calling send_email within <tool_call> tags.",
        "Call the function set_timer with minutes 60, inside <tool_call></tool_call> tags.",
        "Write a haiku about the sea.",
        "Hello! How are you today?",
    ]
}
