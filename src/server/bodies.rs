//! Request bodies held in memory: one budget per listener
//! (`server.max_buffered_body_bytes`) and one per client connection, so
//! neither many clients nor one HTTP/2 connection multiplexing many
//! uploads can make the gateway hold more than it was given. A body's
//! bytes are taken from both as they are read and given back when its
//! request ends (docs/access.md, rule 18).

use std::sync::Arc;
use std::time::Duration;

use crate::error::GatewayError;

/// Bytes of request bodies held now: a gauge (a listener's is the one
/// `/metrics` shows; a connection's is its own, unregistered).
#[derive(Debug, Default)]
pub struct Held(prometheus_client::metrics::gauge::Gauge);

impl Held {
    /// A listener's count, shown by `gauge` (its own when `None`).
    pub fn shown(gauge: Option<prometheus_client::metrics::gauge::Gauge>) -> Held {
        Held(gauge.unwrap_or_default())
    }

    pub fn bytes(&self) -> u64 {
        self.0.get().max(0) as u64
    }

    fn add(&self, n: u64) -> u64 {
        (self.0.inc_by(n as i64) + n as i64).max(0) as u64
    }

    fn sub(&self, n: u64) {
        self.0.dec_by(n as i64);
    }
}

/// One request's bodies' bytes, taken from its listener's and its
/// connection's budgets; given back when it is dropped.
#[derive(Debug)]
pub struct BodyHold {
    listener: Arc<Held>,
    connection: Arc<Held>,
    bytes: u64,
    /// The listener's budget, and a connection's.
    limit: u64,
    per_connection: u64,
}

impl BodyHold {
    pub fn new(listener: Arc<Held>, connection: Arc<Held>, limit: u64, per_connection: u64) -> BodyHold {
        BodyHold { listener, connection, bytes: 0, limit, per_connection }
    }

    /// Take `n` more bytes, or the 503 that says the gateway holds all the
    /// bodies it may (what was taken is given back with the hold).
    pub(crate) fn take(&mut self, n: usize) -> Result<(), GatewayError> {
        let n = n as u64;
        self.bytes += n;
        let all = self.listener.add(n);
        let mine = self.connection.add(n);
        if all > self.limit {
            return Err(GatewayError::Busy {
                message: format!(
                    "slogate holds as many request bodies as it may (server.max_buffered_body_bytes, {} bytes); retry shortly",
                    self.limit
                ),
                retry_after: Duration::from_secs(1),
            });
        }
        if mine > self.per_connection {
            return Err(GatewayError::Busy {
                message: format!(
                    "this connection's requests hold as many body bytes as one connection may ({} bytes: server.max_upload_body and server.max_request_body); retry when one ends",
                    self.per_connection
                ),
                retry_after: Duration::from_secs(1),
            });
        }
        Ok(())
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        self.listener.sub(self.bytes);
        self.connection.sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_bounded_per_listener_and_per_connection_and_given_back() {
        let listener = Arc::new(Held::default());
        let (a, b) = (Arc::new(Held::default()), Arc::new(Held::default()));
        let mut one = BodyHold::new(listener.clone(), a.clone(), 100, 60);
        one.take(50).expect("50 of 100");
        assert!(one.take(20).is_err(), "70 over the connection's 60");
        let mut two = BodyHold::new(listener.clone(), b.clone(), 100, 60);
        assert!(two.take(40).is_err(), "110 over the listener's 100");
        drop(one);
        assert_eq!((listener.bytes(), a.bytes()), (40, 0), "the first request's bytes are back");
        drop(two);
        assert_eq!((listener.bytes(), b.bytes()), (0, 0));
    }
}
