//! Test harness: a scripted mock vLLM replica (`mock`) and helpers to run
//! the gateway in-process on 127.0.0.1:0 (`gateway`). No fixed ports; no
//! sleeping for timing (the mock's scripted delays are upstream behaviour,
//! and waits are bounded polls for a condition).

mod envoy;
mod gateway;
mod mock;
mod redis;
mod shared;

pub use envoy::*;
pub use gateway::*;
pub use mock::*;
pub use redis::*;
pub use shared::*;
