//! Fuzz target: see `sluice_gateway::fuzzing::policy`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_gateway::fuzzing::policy(data));
