//! slogate's load-testing ground truth: a vLLM-faithful simulator (`sim`)
//! and an open-loop load generator (`loadgen`) that measures like a client.

pub mod loadgen;
pub mod sim;
