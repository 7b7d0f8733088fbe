//! Tests against the real bundled model and llama.cpp's golden outputs.

mod common;
mod tokenize;
