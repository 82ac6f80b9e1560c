//! An open-loop load generator that measures like a client: TTFT at the first
//! content-bearing event, every inter-token gap, e2e, tokens, Retry-After.

mod body;
pub mod datasets;
#[cfg(feature = "plots")]
pub mod plots;
pub mod report;
pub mod run;
pub mod scenario;
pub mod vllm;

pub use run::{run, Record, RunResult};
pub use scenario::Scenario;
