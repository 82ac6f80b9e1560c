//! Reports of one benchmark run (`bench report NAME ...`, called by the
//! scenario's driver): each reads what the run left in its folder (loadgen
//! results, timelines, scrapes) and writes `report.md`, `measured.json`
//! (the values the scenario's checks judge; the runner judges them) and
//! its charts. The rules they follow are in `loadtest/README.md`
//! ("Benchmark scenarios").

mod admission;
mod admission_events;
mod dispatch;
mod fleet;
mod health;
mod limits;
mod messages;
pub mod out;
mod paths;
pub mod prom;
pub mod records;
mod resume;
mod short;
mod soak;
mod tenants;
mod tenants_tokens;

pub use dispatch::main;
