//! Tests against the real bundled model and llama.cpp's golden outputs.
//! They need `models/SmolLM2-135M-Instruct.Q4_1.gguf` (`scripts/fetch-model.sh`).

mod cli;
mod common;
mod score;
mod tokenize;
