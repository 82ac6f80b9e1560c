//! A vLLM-faithful simulated replica: the OpenAI API as vLLM emits it, in
//! front of an engine that schedules like vLLM, with vLLM's
//! metrics and switchable faults. Runs in-process (tests, `slogate demo`)
//! or as the `vllm-sim` binary.

pub mod cache;
pub mod config;
mod ctx;
pub mod engine;
pub mod kv_events;
mod messages;
pub mod metrics;
mod prompt;
mod reply;
mod responses;
pub mod server;
mod stored;
pub mod sweep;

pub use config::{FaultConfig, Profile, SimConfig};
pub use server::SimServer;
