//! Which replica holds each stored response (the Responses API's state):
//! vLLM keeps a response, and the conversation it continues, in the memory
//! of the replica that made it, so a follow-up (`previous_response_id`)
//! and the id's own routes must go there. The gateway learns the owner
//! from the answers it relays, with the tenant that made it; a bounded map
//! whose oldest entries go first, kept across reloads with the pool. In a
//! fleet it journals what it learns, and peers read the journal through
//! the fleet's exchange (docs/design/responses.md).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Replica;

/// How many responses a pool remembers the owner of.
pub(crate) const CAPACITY: usize = 200_000;
/// How long an owner is remembered after the response was made.
pub(crate) const KEPT: Duration = Duration::from_secs(24 * 3600);

/// A stored response's owner and the tenant that made it.
#[derive(Clone)]
pub(crate) struct Owner {
    pub(crate) replica: Arc<Replica>,
    pub(crate) tenant: Arc<str>,
}

#[derive(Default)]
struct Map {
    owners: HashMap<Arc<str>, (Owner, Instant)>,
    /// Ids in the order they were learned: the oldest are forgotten first.
    order: VecDeque<Arc<str>>,
}

/// The most learned owners a journal keeps for peers (the newest).
const JOURNAL: usize = 4096;

/// One learned owner, as a fleet's peers read it.
#[derive(Clone)]
pub(crate) struct Learned {
    pub(crate) seq: u64,
    pub(crate) replica: Arc<Replica>,
    pub(crate) id: Arc<str>,
    pub(crate) tenant: Arc<str>,
}

/// A pool's response owners.
#[derive(Default)]
pub(crate) struct Owners {
    map: Mutex<Map>,
    /// In a fleet: what this instance learned, numbered, for its peers.
    journal: Mutex<VecDeque<Learned>>,
    journaling: AtomicBool,
    /// In a fleet: how long a request naming an id not heard of yet waits
    /// for a peer's word (microseconds; 0 alone).
    patience: AtomicU64,
    /// A peer told of an owner.
    told: Notify,
}

impl Owners {
    /// Journal what is learned (in a fleet, where a request naming an id
    /// not heard of yet waits up to `patience` for a peer to tell of it),
    /// or stop and forget the journal.
    pub(crate) fn set_journaling(&self, on: bool, patience: Duration) {
        let micros = if on { patience.as_micros().min(u64::MAX as u128) as u64 } else { 0 };
        self.patience.store(micros, Ordering::Relaxed);
        if self.journaling.swap(on, Ordering::Relaxed) != on && !on {
            self.journal.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// What was learned here after number `since`, at most `max` (the newest).
    pub(crate) fn learned_since(&self, since: u64, max: usize) -> Vec<Learned> {
        let journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        let after = journal.partition_point(|l| l.seq <= since);
        journal.range(after.max(journal.len().saturating_sub(max))..).cloned().collect()
    }

    /// Response `id` was made on `replica` for `tenant`, here: remembered,
    /// and journalled for the fleet's peers.
    pub(crate) fn learn(&self, id: &str, replica: &Arc<Replica>, tenant: Arc<str>) {
        if self.journaling.load(Ordering::Relaxed) {
            let mut j = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            let seq = super::prefix::PrefixIndex::next_seq();
            j.push_back(Learned { seq, replica: replica.clone(), id: id.into(), tenant: tenant.clone() });
            if j.len() > JOURNAL {
                j.pop_front();
            }
        }
        self.remember(id, replica, tenant);
    }

    /// A peer of the fleet says response `id` was made on `replica` for
    /// `tenant`: remembered, and whoever waits for an owner looks again.
    pub(crate) fn heard(&self, id: &str, replica: &Arc<Replica>, tenant: Arc<str>) {
        self.remember(id, replica, tenant);
        self.told.notify_waiters();
    }

    fn remember(&self, id: &str, replica: &Arc<Replica>, tenant: Arc<str>) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let id: Arc<str> = id.into();
        let now = Instant::now();
        if m.owners.insert(id.clone(), (Owner { replica: replica.clone(), tenant }, now)).is_none() {
            m.order.push_back(id);
        }
        while m.order.len() > CAPACITY || m.order.front().is_some_and(|o| m.owners.get(o).is_none_or(|(_, at)| now - *at > KEPT)) {
            let Some(old) = m.order.pop_front() else { break };
            m.owners.remove(&old);
        }
    }

    /// The owner of response `id`, if it is remembered.
    pub(crate) fn get(&self, id: &str) -> Option<Owner> {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.owners.get(id).filter(|(_, at)| at.elapsed() <= KEPT).map(|(o, _)| o.clone())
    }

    /// The owner of response `id`; in a fleet, one not heard of yet is
    /// waited for, at most the patience [`set_journaling`](Self::set_journaling)
    /// set: a follow-up sent to this instance right after its first turn
    /// went through another arrives before the exchange tells of it.
    pub(crate) async fn get_soon(&self, id: &str) -> Option<Owner> {
        let patience = self.patience.load(Ordering::Relaxed);
        if patience == 0 {
            return self.get(id);
        }
        let deadline = Instant::now() + Duration::from_micros(patience);
        loop {
            let told = self.told.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if let Some(o) = self.get(id) {
                return Some(o);
            }
            tokio::time::timeout_at(deadline, told).await.ok()?;
        }
    }

    /// How many it remembers.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().map(|m| m.owners.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(url: &str) -> Arc<Replica> {
        let cfg = crate::config::PoolConfig { replicas: vec![url.into()], ..crate::config::PoolConfig::default() };
        let access = crate::upstream::Access::new(&cfg).expect("access");
        crate::upstream::Pool::new(cfg, access, None).replicas[0].clone()
    }

    #[tokio::test(start_paused = true)]
    async fn owners_are_remembered_for_a_day_and_the_oldest_go_first() {
        let (a, b) = (replica("http://127.0.0.1:1"), replica("http://127.0.0.1:2"));
        let owners = Owners::default();
        owners.learn("resp_1", &a, "team".into());
        owners.learn("resp_2", &b, "other".into());
        let got = owners.get("resp_1").expect("remembered");
        assert!(Arc::ptr_eq(&got.replica, &a) && &*got.tenant == "team");
        assert!(owners.get("resp_3").is_none());
        tokio::time::advance(KEPT + Duration::from_secs(1)).await;
        assert!(owners.get("resp_2").is_none(), "forgotten after a day");
        owners.learn("resp_3", &a, "team".into());
        assert_eq!(owners.len(), 1, "the expired are dropped as new ones come");
        for i in 0..CAPACITY + 10 {
            owners.learn(&format!("r{i}"), &b, "team".into());
        }
        assert_eq!(owners.len(), CAPACITY);
        assert!(owners.get("r0").is_none() && owners.get(&format!("r{}", CAPACITY + 9)).is_some(), "the oldest went first");
    }

    #[tokio::test(start_paused = true)]
    async fn in_a_fleet_an_owner_not_heard_of_yet_is_waited_for_a_while() {
        let a = replica("http://127.0.0.1:1");
        let owners = Arc::new(Owners::default());
        // Alone: no one else can tell of it.
        let start = Instant::now();
        assert!(owners.get_soon("resp_1").await.is_none());
        assert_eq!(start.elapsed(), Duration::ZERO, "alone, nothing is waited for");
        owners.set_journaling(true, Duration::from_millis(300));
        let waiting = tokio::spawn({
            let owners = owners.clone();
            async move { owners.get_soon("resp_1").await.map(|o| o.tenant) }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        owners.heard("resp_2", &a, "team".into());
        tokio::time::sleep(Duration::from_millis(50)).await;
        owners.heard("resp_1", &a, "team".into());
        assert_eq!(waiting.await.expect("task").as_deref(), Some("team"), "found once a peer told of it");
        assert_eq!(start.elapsed(), Duration::from_millis(150));
        let start = Instant::now();
        assert!(owners.get_soon("resp_9").await.is_none());
        assert_eq!(start.elapsed(), Duration::from_millis(300), "never told: routed as unknown after the patience");
    }
}
