//! The integration tests, one binary: each module drives the real gateway
//! (in-process on 127.0.0.1:0, or the built binary) against mock or
//! simulated replicas and real tools, as a user would. `common` is the
//! harness they share. Two tests install the process-wide tracing
//! subscriber and so run as binaries of their own: tests/otel.rs and
//! tests/otel_down.rs.

mod common;

mod admission;
mod agents;
mod bench_scenarios;
mod demo;
mod deploy;
mod deploy_inference;
mod discovery;
mod docs;
mod edge;
mod endpoints;
mod enforcement;
mod engines;
mod epp;
mod epp_envoy;
mod faults;
mod fleet;
#[cfg(feature = "fuzzing")]
mod fuzz_properties;
mod gateway;
mod kv_events;
mod limit_store;
mod limits;
mod migration;
mod operations;
mod preemption;
mod prefix;
mod privilege;
mod promises;
mod reference_config;
mod reload;
mod replicas;
mod resume;
mod resume_messages;
mod rooms;
mod rules;
mod streaming;
mod tenants;
mod uploads;
