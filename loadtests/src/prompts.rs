//! Request shapes and prompts of an exact token count.
//!
//! Every prompt is different from its first few tokens on (it opens with a random tag and its
//! request number, then stitches sentences from a built-in corpus chosen by a per-request random
//! stream), so no prefix cache on the server can make a request cheaper than its shape says.
//! The text is then cut to exactly N tokens of the model's tokenizer: encode, truncate the ids,
//! decode, and re-encode until the count holds.

use std::path::Path;
use std::str::FromStr;

use sluice_engine::model::gguf::GgufFile;
use sluice_engine::model::tokenizer::Tokenizer;

use crate::error::{Error, Result};
use crate::rng::Rng;

/// Output tokens of a shape given as input tokens only (`4k`).
pub const DEFAULT_OUTPUT_TOKENS: usize = 64;

/// A request shape: exact prompt tokens and `max_tokens` (generated in full: `ignore_eos`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// As written on the command line (`256:128`, `4k`).
    pub label: String,
    pub input: usize,
    pub output: usize,
}

/// `256`, `1k` (= 1000, so `16k` plus its output still fits a 16384-token window).
fn parse_count(s: &str) -> Result<usize> {
    let s = s.trim().to_ascii_lowercase();
    let (digits, scale) = match s.strip_suffix('k') {
        Some(d) => (d, 1000),
        None => (s.as_str(), 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| Error::Config(format!("{s:?} is not a token count (e.g. 256 or 4k)")))?;
    match n.checked_mul(scale) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(Error::Config(format!("token count {s:?} must be positive"))),
    }
}

impl FromStr for Shape {
    type Err = Error;

    /// `INPUT:OUTPUT` (`256:128`, `1k:256`) or just `INPUT` (`4k`, with 64 output tokens).
    fn from_str(s: &str) -> Result<Self> {
        let (input, output) = match s.split_once(':') {
            Some((i, o)) => (parse_count(i)?, parse_count(o)?),
            None => (parse_count(s)?, DEFAULT_OUTPUT_TOKENS),
        };
        Ok(Self {
            label: s.trim().to_ascii_lowercase(),
            input,
            output,
        })
    }
}

/// Where a run's prompts come from: `prompt(tokens, request)` is the prompt of request number
/// `request` (unique within the run), `tokens` long.
pub trait PromptSource: Send + Sync {
    fn prompt(&self, tokens: usize, request: u64) -> Result<String>;
}

const NAMES: &[&str] = &[
    "Amara", "Bastien", "Chen", "Dolores", "Emeka", "Freya", "Gustavo", "Hana", "Ivan", "Jamila",
    "Kenji", "Leonor", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tariq",
];
const CITIES: &[&str] = &[
    "Lisbon",
    "Nairobi",
    "Osaka",
    "Valparaíso",
    "Tromsø",
    "Marrakesh",
    "Winnipeg",
    "Hanoi",
    "Tbilisi",
    "Adelaide",
    "Cork",
    "Cusco",
    "Gdańsk",
    "Chennai",
    "Quebec City",
    "Reykjavík",
];
const THINGS: &[&str] = &[
    "the lighthouse",
    "a copper kettle",
    "the night train",
    "an old atlas",
    "the bakery",
    "a borrowed bicycle",
    "the greenhouse",
    "a brass telescope",
    "the ferry",
    "a wool blanket",
    "the observatory",
    "a clay teapot",
    "the river market",
    "a pocket radio",
    "the archive",
];
const ANIMALS: &[&str] = &[
    "heron", "badger", "octopus", "kestrel", "otter", "ibex", "gecko", "moth", "salmon", "lynx",
];
const COLORS: &[&str] = &[
    "amber",
    "slate grey",
    "teal",
    "crimson",
    "ochre",
    "ivory",
    "indigo",
    "olive",
    "coral",
];

/// Sentence templates: `{name}`, `{city}`, `{thing}`, `{animal}`, `{color}`, `{n}` (a number)
/// and `{year}` are filled per use.
const TEMPLATES: &[&str] = &[
    "{name} arrived in {city} on a wet Tuesday and went straight to {thing}.",
    "By {year} the population of {city} had grown to roughly {n} thousand people.",
    "A {color} {animal} was seen near {thing} for {n} days in a row.",
    "The recipe calls for {n} grams of flour, a pinch of salt, and patience.",
    "{name} kept a notebook of every {animal} spotted along the coast.",
    "In {year}, engineers rebuilt {thing} with {color} steel and reclaimed timber.",
    "Nobody in {city} could explain why the clocks ran {n} seconds fast.",
    "The committee met {n} times before agreeing on the colour: {color}.",
    "{name} argued that {thing} deserved a museum of its own.",
    "Rain fell on {city} for {n} hours, flooding the lower streets.",
    "The {animal} is a patient hunter and rarely wastes energy.",
    "When {name} opened {thing}, the smell of cedar filled the room.",
    "A survey in {year} counted {n} species of {animal} in the valley.",
    "The tram to {city} leaves at {n} minutes past every hour.",
    "{name} painted the door {color} and the neighbours complained for a week.",
    "Photosynthesis converts light into chemical energy stored in sugars.",
    "The treaty signed in {year} redrew the border near {city}.",
    "Compound interest means that {n} coins today may be many more tomorrow.",
    "{name} learned to sail on a lake where a single {animal} lived.",
    "Every spring the market in {city} sells {color} tulips by the armful.",
    "Sound travels faster through water than through air.",
    "{thing} was closed for repairs from {year} until the following summer.",
    "The orchestra rehearsed the final movement {n} times without a break.",
    "{name} wrote that the best maps leave room for the unknown.",
    "A glacier near {city} retreats about {n} metres each year.",
    "The {animal} on the logo was redrawn in {color} for the anniversary.",
    "Bread rises because yeast releases carbon dioxide into the dough.",
    "{name} and a friend walked {n} kilometres to reach {thing}.",
    "The library in {city} lends seeds as well as books.",
    "Volcanic soil is often rich in minerals that crops need.",
    "In {year}, a storm knocked {thing} off its foundations.",
    "{name} counted {n} steps from the gate to the front door.",
    "Tides are driven mostly by the gravity of the moon.",
    "The old quarter of {city} is famous for its {color} roof tiles.",
    "A {animal} can travel surprising distances in a single night.",
    "{name} repaired {thing} using parts from {n} different kits.",
    "The first printed guide to {city} appeared in {year}.",
    "Honey found in ancient tombs was still edible after thousands of years.",
    "{name} insisted the soup needed exactly {n} bay leaves.",
    "The bridge over the river at {city} sways slightly in strong wind.",
    "Chess players in {city} gather at {thing} every Sunday morning.",
    "A well-tuned bicycle chain loses very little energy to friction.",
    "{name} photographed a {color} sky over {city} in {year}.",
    "The ferry carries {n} passengers and a handful of cars.",
    "Owls can turn their heads much further than people can.",
    "{name} believed every good argument begins with a question.",
    "The festival in {city} lasts {n} days and ends with fireworks.",
    "Copper turns green as it slowly reacts with the air.",
    "In {year}, {name} planted {n} apple trees behind {thing}.",
    "The museum's {animal} skeleton is its most visited exhibit.",
    "Wind turbines near {city} supply power to {n} thousand homes.",
    "{name} said the trick to bread is a hot oven and a cold kitchen.",
    "The first snow in {city} usually falls before the end of October.",
    "A {color} scarf was left on a bench near {thing}.",
    "Bees communicate the location of flowers with a waggle dance.",
    "{name} translated {n} letters written in {year} by a sailor from {city}.",
    "The hardest part of any journey is often the first mile.",
    "Salt was once so valuable that it was used as currency.",
    "{name} fed the {animal} at {thing} every morning for a year.",
    "A quiet street in {city} hides a workshop that repairs {n} clocks a week.",
];

fn sentence(rng: &mut Rng) -> String {
    let mut s = rng.pick(TEMPLATES).to_owned();
    while let Some(at) = s.find('{') {
        let Some(len) = s[at..].find('}') else { break };
        let fill = match &s[at + 1..at + len] {
            "name" => rng.pick(NAMES).to_owned(),
            "city" => rng.pick(CITIES).to_owned(),
            "thing" => rng.pick(THINGS).to_owned(),
            "animal" => rng.pick(ANIMALS).to_owned(),
            "color" => rng.pick(COLORS).to_owned(),
            "year" => (1700 + rng.below(325)).to_string(),
            _ => (2 + rng.below(998)).to_string(),
        };
        s.replace_range(at..=at + len, &fill);
    }
    s
}

/// Appends about `chars` characters of sentences, in paragraphs.
fn extend(text: &mut String, rng: &mut Rng, chars: usize) {
    let target = text.len() + chars;
    while text.len() < target {
        if !text.is_empty() {
            text.push_str(if rng.below(5) == 0 { "\n\n" } else { " " });
        }
        text.push_str(&sentence(rng));
    }
}

/// Builds prompts with the model's own tokenizer.
#[derive(Debug)]
pub struct PromptBuilder {
    tokenizer: Tokenizer,
    seed: u64,
}

impl PromptBuilder {
    /// The tokenizer of the GGUF model at `path`; `seed` varies the text between runs.
    pub fn from_model(path: &Path, seed: u64) -> Result<Self> {
        let fail = |e: &dyn std::fmt::Display| Error::Prompt(format!("{}: {e}", path.display()));
        let gguf = GgufFile::open(path).map_err(|e| fail(&e))?;
        let tokenizer = Tokenizer::from_gguf(&gguf).map_err(|e| fail(&e))?;
        Ok(Self { tokenizer, seed })
    }

    pub fn count(&self, text: &str) -> Result<usize> {
        Ok(self.encode(text)?.len())
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| Error::Prompt(e.to_string()))
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| Error::Prompt(e.to_string()))
    }

    /// A prompt that encodes (plain text, no BOS) to exactly `tokens` tokens.
    pub fn build(&self, tokens: usize, request: u64) -> Result<String> {
        let mut rng = Rng::new(self.seed, request);
        // A per-request tag first, so prompts part ways within their first few tokens.
        let mut text = format!("{:016x} | document {request}\n\n", rng.next_u64());
        extend(&mut text, &mut rng, tokens * 5);
        let mut ids = self.encode(&text)?;
        for _ in 0..64 {
            if ids.len() < tokens {
                let missing = tokens - ids.len();
                extend(&mut text, &mut rng, missing * 6 + 32);
                ids = self.encode(&text)?;
                continue;
            }
            ids.truncate(tokens);
            text = self.decode(&ids)?;
            ids = self.encode(&text)?;
            if ids.len() == tokens {
                return Ok(text);
            }
        }
        Err(Error::Prompt(format!(
            "could not build a prompt of exactly {tokens} tokens (request {request})"
        )))
    }
}

impl PromptSource for PromptBuilder {
    fn prompt(&self, tokens: usize, request: u64) -> Result<String> {
        self.build(tokens, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let s: Shape = "256:128".parse().unwrap();
        assert_eq!((s.input, s.output, s.label.as_str()), (256, 128, "256:128"));
        let s: Shape = "1k:256".parse().unwrap();
        assert_eq!((s.input, s.output), (1000, 256));
        for (text, input) in [("4k", 4000), ("8K", 8000), ("12k", 12000), ("16k", 16000)] {
            let s: Shape = text.parse().unwrap();
            assert_eq!(
                (s.input, s.output),
                (input, DEFAULT_OUTPUT_TOKENS),
                "{text}"
            );
        }
        for bad in ["", "0:5", "5:0", "k", "1.5k", "a:b", "-3", "4k:"] {
            assert!(bad.parse::<Shape>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sentences_fill_every_slot() {
        let mut rng = Rng::new(7, 1);
        for _ in 0..500 {
            let s = sentence(&mut rng);
            assert!(!s.contains('{') && !s.contains('}'), "{s}");
        }
    }

    fn builder() -> Option<PromptBuilder> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(sluice_engine::model::DEFAULT_MODEL_PATH);
        if !path.exists() {
            eprintln!(
                "skipping: model {} not found (scripts/fetch-model.sh fetches it)",
                path.display()
            );
            return None;
        }
        Some(PromptBuilder::from_model(&path, 0x5eed).unwrap())
    }

    #[test]
    fn prompts_have_exact_token_counts() {
        let Some(b) = builder() else { return };
        for (tokens, request) in [(1, 0), (7, 1), (64, 2), (256, 3), (1000, 4), (4000, 5)] {
            let p = b.build(tokens, request).unwrap();
            assert_eq!(b.count(&p).unwrap(), tokens, "request {request}");
        }
        // Different seeds give different text for the same request number.
        let other = PromptBuilder {
            tokenizer: b.tokenizer.clone(),
            seed: 1,
        };
        assert_ne!(b.build(256, 3).unwrap(), other.build(256, 3).unwrap());
    }

    #[test]
    fn prompts_differ_from_the_start_and_are_reproducible() {
        let Some(b) = builder() else { return };
        let prompts: Vec<String> = (0..16).map(|r| b.build(256, r).unwrap()).collect();
        let firsts: std::collections::HashSet<Vec<u32>> = prompts
            .iter()
            .map(|p| b.tokenizer.encode(p, false).unwrap()[..4].to_vec())
            .collect();
        assert_eq!(
            firsts.len(),
            prompts.len(),
            "the first 4 tokens repeat across requests"
        );
        assert_eq!(b.build(256, 5).unwrap(), prompts[5]);
    }
}
