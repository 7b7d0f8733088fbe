//! Fuzz target: see `sluice_engine::fuzzing::gguf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_engine::fuzzing::gguf(data));
