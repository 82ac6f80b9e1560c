//! Upstream pools: replicas, their health, their connections, and which one
//! serves a request.
//!
//! This room offers replicas and their slots and knows nothing of who asks:
//! [`Pool::pick`] takes a slot on a healthy replica ([`ReplicaSlot`]), and
//! dropping the slot gives it back. Nothing here calls back into admission;
//! admission wraps a slot in its lease and decides who gets the next one.

mod access;
mod client_body;
pub(crate) mod conn;
pub(crate) mod dns;
mod first_token;
pub(crate) mod health;
pub(crate) mod kv_events;
pub(crate) mod limit;
mod link;
mod outgoing;
pub(crate) mod owners;
mod parts;
mod payload;
pub(crate) mod pick;
mod pool;
pub(crate) mod prefix;
pub(crate) mod relay;
mod replica;
mod send;
mod share;
mod slot;
mod take;
pub(crate) mod tls;
pub(crate) mod verdict;
mod wire;

pub(crate) use access::Access;
pub(crate) use client_body::ClientBody;
pub(crate) use conn::Reads;
pub(crate) use outgoing::Outgoing;
pub(crate) use payload::{SendBody, Upload, UploadCheck, UploadFailure};
pub use pool::PoolError;
pub(crate) use pool::{PickError, Pool, Room};
pub(crate) use relay::Relay;
pub(crate) use replica::{Load, Replica};
pub(crate) use send::{send_with_retry, Attempts, HeadRetried};
pub(crate) use slot::ReplicaSlot;
pub(crate) use wire::{list_items, HOP_BY_HOP};
