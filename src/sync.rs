//! Small shared-state types the rooms use: nothing here knows a request.

use std::sync::atomic::{AtomicU64, Ordering};

/// An `f64` that threads read and write without a lock (its bits in an
/// `AtomicU64`). Every use is a published estimate or setting, read with
/// `Relaxed` ordering: no other memory is ordered by it.
#[derive(Debug, Default)]
pub(crate) struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub(crate) fn new(v: f64) -> AtomicF64 {
        AtomicF64(AtomicU64::new(v.to_bits()))
    }

    pub(crate) fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn store(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    /// Replace the value with `f(old)`, atomically; `f` returns `None` to
    /// leave it as it is. Returns whether it changed.
    pub(crate) fn update(&self, mut f: impl FnMut(f64) -> Option<f64>) -> bool {
        self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| f(f64::from_bits(bits)).map(f64::to_bits)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::AtomicF64;

    #[test]
    fn holds_updates_and_refuses_an_update_that_declines() {
        let a = AtomicF64::new(1.5);
        assert_eq!(a.load(), 1.5);
        a.store(-0.25);
        assert_eq!(a.load(), -0.25);
        assert!(a.update(|v| Some(v * 4.0)));
        assert_eq!(a.load(), -1.0);
        assert!(!a.update(|_| None));
        assert_eq!(a.load(), -1.0);
        assert_eq!(AtomicF64::default().load(), 0.0);
    }
}
