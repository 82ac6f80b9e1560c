//! An open-loop load generator that measures like a client: TTFT at the first
//! content-bearing event, every inter-token gap, e2e, tokens, Retry-After.

mod body;
pub mod datasets;
mod exchange;
#[cfg(feature = "plots")]
pub mod plots;
pub mod prompt;
pub mod record;
pub mod report;
pub mod run;
pub mod scenario;
pub mod summary;
pub mod vllm;

pub use record::{Record, RunResult};
pub use run::run;
pub use scenario::Scenario;
