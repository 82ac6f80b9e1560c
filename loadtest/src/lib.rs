//! slogate's load-testing ground truth: a vLLM-faithful simulator (`sim`)
//! and an open-loop load generator (`loadgen`) that measures like a client.

pub mod bench;
pub mod loadgen;
pub mod sim;

/// Wall-clock nanoseconds since the Unix epoch: the one clock two processes on
/// a machine share, so the simulator's chunk stamps (`--stamp-events`) and the
/// load generator's send times can be subtracted.
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
