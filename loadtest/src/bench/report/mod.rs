//! Reports of one benchmark run (`bench report NAME ...`, called by the
//! scenario's driver): each reads what the run left in its folder (loadgen
//! results, timelines, scrapes) and writes `report.md`, `measured.json`
//! (the values the scenario's checks judge; the runner judges them) and
//! its charts. The rules they follow are in `loadtest/README.md`
//! ("Benchmark scenarios").

mod admission;
mod admission_events;
mod calibration;
mod cost;
mod dispatch;
mod epp;
mod fleet;
mod health;
mod independent;
mod limits;
mod litellm;
mod messages;
mod migration;
pub mod out;
mod overhead;
mod overhead_more;
mod overhead_parts;
mod overhead_text;
mod paths;
mod prefix;
pub mod prom;
pub mod records;
mod resume;
mod retry;
mod scale;
mod short;
mod soak;
mod tenants;
mod tenants_tokens;
mod uploads;

pub use dispatch::main;
