//! Fair sharing of a tier's slots among tenants (API keys): a freed slot
//! goes to the waiting tenant with the least service for its weight,
//! counted in tokens; a tenant back from a pause comes back without credit.
//! Every decision is O(log tenants). The rules are
//! docs/design/fair-share.md's (rules 1 to 5).

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

pub(crate) use crate::limits::Share;

/// Where a tenant stands against its fair part of a tier's slots
/// (docs/design/fair-share.md, rules 6 and 21).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) enum Standing {
    /// The only tenant running or waiting (or tenants are not accounted
    /// for): the tier is its own.
    #[default]
    Alone,
    /// Holds fewer slots than its part.
    Under,
    /// Holds its part or more while other tenants run or wait.
    Over(OverShare),
}

/// A tenant over its fair part: what it holds, what its part is, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OverShare {
    pub(crate) held: usize,
    /// Its fair part of the slots (`slots` x `weight` / `total_weight`).
    pub(crate) part: f64,
    pub(crate) slots: usize,
    /// Its requests waiting.
    pub(crate) waiting: usize,
    pub(crate) weight: f64,
    /// The weights of the tenants running or waiting, its own included.
    pub(crate) total_weight: f64,
}

/// A counter value, totally ordered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Virtual(f64);

impl Eq for Virtual {}
impl PartialOrd for Virtual {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Virtual {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.0.total_cmp(&other.0)
    }
}

/// Something queued for a tenant (a waiter), with an id unique in the queue
/// and increasing with arrival.
pub(crate) trait Queued {
    fn id(&self) -> u64;
    fn share(&self) -> Share;
    /// What serving it costs its tenant (tokens, before the weight).
    fn cost(&self) -> f64;
    /// Served before its tenant's other waiters (behind those like it): a
    /// preempted stream, whose client holds part of its answer.
    fn first(&self) -> bool {
        false
    }
}

/// One tier's waiters, served fairly among tenants.
pub(crate) struct FairQueue<W> {
    /// Each waiting tenant's requests, first come first served.
    backlogs: HashMap<u32, VecDeque<W>>,
    /// Waiting tenants by counter (then id, for a stable order).
    order: BTreeSet<(Virtual, u32)>,
    /// Every tenant's counter: tokens served over its weight.
    counters: HashMap<u32, f64>,
    /// Waiter id -> tenant, in arrival order (the oldest waiter, deadlines).
    arrivals: BTreeMap<u64, u32>,
    /// The counter of the last tenant served: where a tenant coming back
    /// with nobody waiting starts.
    floor: f64,
    /// Tenants with requests holding slots or waiting, and their weights' sum.
    activity: HashMap<u32, Activity>,
    active_weight: f64,
}

/// A tenant's requests in the tier now.
#[derive(Debug, Clone, Copy, Default)]
struct Activity {
    running: usize,
    waiting: usize,
    /// Its weight when it became active (what `active_weight` counts).
    weight: f64,
}

fn weight(share: Share) -> f64 {
    if share.weight > 0.0 {
        share.weight
    } else {
        1.0
    }
}

impl<W> Default for FairQueue<W> {
    fn default() -> Self {
        FairQueue {
            backlogs: HashMap::new(),
            order: BTreeSet::new(),
            counters: HashMap::new(),
            arrivals: BTreeMap::new(),
            floor: 0.0,
            activity: HashMap::new(),
            active_weight: 0.0,
        }
    }
}

impl<W: Queued> FairQueue<W> {
    pub(crate) fn len(&self) -> usize {
        self.arrivals.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.arrivals.is_empty()
    }

    /// Change what `share`'s tenant has running or waiting (O(1)).
    fn active(&mut self, share: Share, change: impl FnOnce(&mut Activity)) {
        let a = self.activity.entry(share.tenant).or_default();
        let was = a.running + a.waiting > 0;
        change(a);
        let is = a.running + a.waiting > 0;
        match (was, is) {
            (false, true) => {
                a.weight = weight(share);
                self.active_weight += a.weight;
            }
            (true, false) => {
                self.active_weight -= a.weight;
                self.activity.remove(&share.tenant);
                if self.activity.is_empty() {
                    self.active_weight = 0.0; // no drift left behind
                }
            }
            (false, false) => {
                self.activity.remove(&share.tenant);
            }
            (true, true) => {}
        }
    }

    /// A request of `share`'s tenant that held a slot ended.
    pub(crate) fn ended(&mut self, share: Share) {
        self.active(share, |a| a.running = a.running.saturating_sub(1));
    }

    /// Does `share`'s tenant hold fewer of the tier's `slots` than its fair
    /// part (its weight over the weights of the tenants running or waiting,
    /// itself included)? Never while it is the only one. O(1).
    pub(crate) fn under_share(&self, share: Share, slots: usize) -> bool {
        self.standing(share, slots) == Standing::Under
    }

    /// Where `share`'s tenant stands against its fair part of the tier's
    /// `slots` (its weight over the weights of the tenants running or
    /// waiting, itself included). O(1).
    pub(crate) fn standing(&self, share: Share, slots: usize) -> Standing {
        let own = self.activity.get(&share.tenant).filter(|a| a.running + a.waiting > 0);
        let w = own.map_or(weight(share), |a| a.weight);
        let total = self.active_weight + if own.is_none() { w } else { 0.0 };
        if total <= w * (1.0 + 1e-9) {
            return Standing::Alone;
        }
        let held = own.map_or(0, |a| a.running);
        let part = slots as f64 * w / total;
        if (held as f64) < part {
            Standing::Under
        } else {
            Standing::Over(OverShare { held, part, slots, waiting: own.map_or(0, |a| a.waiting), weight: w, total_weight: total })
        }
    }

    /// The waiting tenant furthest over its fair part of `slots` (most slots
    /// held for its part), with its newest waiter: the one to refuse first
    /// when the queue is full. O(waiting tenants).
    pub(crate) fn most_over(&self, slots: usize) -> Option<(u32, u64)> {
        let mut best: Option<(f64, u32)> = None;
        for (&tenant, _) in self.backlogs.iter().filter(|(_, b)| !b.is_empty()) {
            let weight = self.activity.get(&tenant).map_or(1.0, |a| a.weight);
            let Standing::Over(o) = self.standing(Share { tenant, weight }, slots) else { continue };
            let ratio = o.held as f64 / o.part.max(1e-9);
            if best.is_none_or(|(r, t)| ratio > r || (ratio == r && tenant < t)) {
                best = Some((ratio, tenant));
            }
        }
        let (_, tenant) = best?;
        Some((tenant, self.backlogs.get(&tenant)?.back()?.id()))
    }

    /// `tenant`'s requests waiting. O(1).
    pub(crate) fn waiting_of(&self, tenant: u32) -> usize {
        self.activity.get(&tenant).map_or(0, |a| a.waiting)
    }

    /// Are tenants other than `share`'s running or waiting? O(1).
    pub(crate) fn others_active(&self, share: Share) -> bool {
        let own = self.activity.get(&share.tenant).map_or(0.0, |a| a.weight);
        self.active_weight - own > 1e-9
    }

    /// The tenant's counter (0 for one never served).
    pub(crate) fn counter(&self, tenant: u32) -> f64 {
        self.counters.get(&tenant).copied().unwrap_or(0.0)
    }

    /// Queue `w` behind its tenant's earlier requests. A tenant that starts
    /// waiting is lifted to the least counter among those waiting (or to the
    /// last served one's), less its request's cost: no more credit for the
    /// time it was away than that one request.
    pub(crate) fn push(&mut self, w: W) {
        let share = w.share();
        let tenant = share.tenant;
        self.active(share, |a| a.waiting += 1);
        self.arrivals.insert(w.id(), tenant);
        if let Some(b) = self.backlogs.get_mut(&tenant) {
            match w.first() {
                true => b.insert(b.iter().take_while(|o| o.first()).count(), w),
                false => b.push_back(w),
            }
            return;
        }
        let least = self.order.first().map_or(self.floor, |(v, _)| v.0);
        let quantum = w.cost() / if share.weight > 0.0 { share.weight } else { 1.0 };
        let c = self.counters.entry(tenant).or_insert(0.0);
        *c = c.max(least - quantum);
        self.order.insert((Virtual(*c), tenant));
        self.backlogs.insert(tenant, VecDeque::from([w]));
    }

    /// The waiter that would be served next.
    #[cfg(test)]
    fn front(&self) -> Option<&W> {
        self.first_of(self.first_tenant()?, 1).next()
    }

    /// The tenant served next.
    pub(crate) fn first_tenant(&self) -> Option<u32> {
        self.order.first().map(|(_, t)| *t)
    }

    /// `tenant`'s first `n` waiters, in the order they will be served.
    pub(crate) fn first_of(&self, tenant: u32, n: usize) -> impl Iterator<Item = &W> {
        self.backlogs.get(&tenant).into_iter().flat_map(move |b| b.iter().take(n))
    }

    /// The waiter that has waited longest, whatever its tenant.
    pub(crate) fn oldest(&self) -> Option<&W> {
        let (&id, tenant) = self.arrivals.first_key_value()?;
        self.backlogs.get(tenant)?.iter().find(|w| w.id() == id)
    }

    /// Take the next waiter: the oldest of the tenant with the least counter.
    /// Not charged yet (see [`FairQueue::charge`]): it may have gone away.
    #[cfg(test)]
    pub(crate) fn pop(&mut self) -> Option<W> {
        let &(_, tenant) = self.order.first()?;
        self.pop_tenant(tenant)
    }

    /// The first waiting tenant in the fair order whose next request `may`
    /// go now (O(waiting tenants) at worst).
    pub(crate) fn first_tenant_where(&self, may: impl Fn(&W) -> bool) -> Option<u32> {
        self.order.iter().find(|(_, t)| self.backlogs.get(t).and_then(|b| b.front()).is_some_and(&may)).map(|(_, t)| *t)
    }

    /// Take `tenant`'s oldest waiter (not charged yet).
    pub(crate) fn pop_tenant(&mut self, tenant: u32) -> Option<W> {
        let v = Virtual(self.counter(tenant));
        let backlog = self.backlogs.get_mut(&tenant)?;
        let w = backlog.pop_front()?;
        if backlog.is_empty() {
            self.backlogs.remove(&tenant);
            self.order.remove(&(v, tenant));
        }
        self.arrivals.remove(&w.id());
        self.active(w.share(), |a| a.waiting = a.waiting.saturating_sub(1));
        Some(w)
    }

    /// Remove waiter `id` of `tenant` (its request went away, or it will not
    /// be served in time).
    pub(crate) fn remove(&mut self, tenant: u32, id: u64) -> Option<W> {
        let backlog = self.backlogs.get_mut(&tenant)?;
        let i = backlog.iter().position(|w| w.id() == id)?;
        let w = backlog.remove(i)?;
        if backlog.is_empty() {
            self.backlogs.remove(&tenant);
            let c = self.counter(tenant);
            self.order.remove(&(Virtual(c), tenant));
        }
        self.arrivals.remove(&id);
        self.active(w.share(), |a| a.waiting = a.waiting.saturating_sub(1));
        Some(w)
    }

    /// Waiter ids with their tenants, oldest first.
    #[cfg(test)]
    fn by_arrival(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.arrivals.iter().map(|(&id, &t)| (id, t))
    }

    /// Every waiter, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &W> {
        self.backlogs.values().flatten()
    }

    /// `share`'s tenant was granted a slot for a request of `tokens` (it
    /// runs until [`FairQueue::ended`]).
    pub(crate) fn charge(&mut self, share: Share, tokens: f64) {
        self.active(share, |a| a.running += 1);
        self.account(share, tokens, true);
    }

    /// `share`'s tenant's request ended having cost `tokens` more than it
    /// was charged (negative: less).
    pub(crate) fn settle(&mut self, share: Share, tokens: f64) {
        self.account(share, tokens, false);
    }

    fn account(&mut self, share: Share, tokens: f64, grant: bool) {
        let weight = weight(share);
        let waiting = self.backlogs.contains_key(&share.tenant);
        let c = self.counters.entry(share.tenant).or_insert(0.0);
        let before = *c;
        if grant {
            // Served now: a tenant that was away starts from where the
            // others are. (Not at a settlement: a tenant whose weight put it
            // behind would be lifted to the last one served each time one
            // of its requests ended, and lose the lead its weight gave it.)
            *c = c.max(self.floor);
            self.floor = *c;
        }
        *c += tokens / weight;
        let after = *c;
        if waiting && before != after {
            self.order.remove(&(Virtual(before), share.tenant));
            self.order.insert((Virtual(after), share.tenant));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct W {
        id: u64,
        share: Share,
        first: bool,
    }
    impl Queued for W {
        fn id(&self) -> u64 {
            self.id
        }
        fn share(&self) -> Share {
            self.share
        }
        fn cost(&self) -> f64 {
            100.0
        }
        fn first(&self) -> bool {
            self.first
        }
    }

    struct Q {
        q: FairQueue<W>,
        next: u64,
    }

    impl Q {
        fn new() -> Q {
            Q { q: FairQueue::default(), next: 0 }
        }
        fn push(&mut self, tenant: u32, weight: f64) {
            self.next += 1;
            self.q.push(W { id: self.next, share: Share { tenant, weight }, first: false });
        }
        /// Serve the next waiter, charging it `tokens`; its tenant.
        fn serve(&mut self, tokens: f64) -> u32 {
            let w = self.q.pop().expect("a waiter");
            self.q.charge(w.share, tokens);
            w.share.tenant
        }
    }

    #[test]
    fn a_preempted_stream_goes_before_its_tenants_other_waiters_in_its_order() {
        let mut q = FairQueue::default();
        let share = Share { tenant: 1, weight: 1.0 };
        for (id, first) in [(1, false), (2, false), (3, true), (4, false), (5, true)] {
            q.push(W { id, share, first });
        }
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|w| w.id)).collect();
        assert_eq!(order, [3, 5, 1, 2, 4]);
    }

    #[test]
    fn equal_tenants_alternate_whatever_order_they_queued_in() {
        let mut q = Q::new();
        for _ in 0..6 {
            q.push(1, 1.0);
        }
        for _ in 0..6 {
            q.push(2, 1.0);
        }
        let served: Vec<u32> = (0..12).map(|_| q.serve(100.0)).collect();
        // Ties go to the lower id; after that each takes its turn.
        assert_eq!(served, vec![1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2]);
        assert!(q.q.is_empty());
    }

    #[test]
    fn service_is_counted_in_tokens_not_requests() {
        // Tenant 1's requests cost 4x tenant 2's: 2 gets four for each of 1's.
        let mut q = Q::new();
        for _ in 0..10 {
            q.push(1, 1.0);
            q.push(2, 1.0);
        }
        let mut count = [0usize; 3];
        let mut tokens = [0.0f64; 3];
        for _ in 0..10 {
            let t = q.q.front().expect("front").share.tenant;
            let cost = if t == 1 { 400.0 } else { 100.0 };
            assert_eq!(q.serve(cost), t);
            count[t as usize] += 1;
            tokens[t as usize] += cost;
        }
        assert_eq!((count[1], count[2]), (2, 8), "tokens served: {tokens:?}");
        assert!((tokens[1] - tokens[2]).abs() <= 400.0, "within one request of equal tokens: {tokens:?}");
    }

    #[test]
    fn weights_split_service_in_proportion() {
        let mut q = Q::new();
        for _ in 0..200 {
            q.push(1, 3.0);
            q.push(2, 1.0);
        }
        let served: Vec<u32> = (0..200).map(|_| q.serve(50.0)).collect();
        let ones = served.iter().filter(|&&t| t == 1).count();
        assert_eq!((ones, 200 - ones), (150, 50), "3:1");
    }

    #[test]
    fn settlements_keep_the_weights_proportion() {
        // Both backlogged; each request is charged 50 at its grant and 20
        // more when it ends, eight grants later.
        let mut q = Q::new();
        for _ in 0..400 {
            q.push(1, 3.0);
            q.push(2, 1.0);
        }
        let mut ending: std::collections::VecDeque<Share> = Default::default();
        let mut served = [0usize; 3];
        for _ in 0..400 {
            let w = q.q.pop().expect("a waiter");
            q.q.charge(w.share, 50.0);
            served[w.share.tenant as usize] += 1;
            ending.push_back(w.share);
            if ending.len() > 8 {
                let s = ending.pop_front().expect("one");
                q.q.settle(s, 20.0);
            }
        }
        assert!((295..=305).contains(&served[1]), "3:1 of 400: {served:?}");
    }

    #[test]
    fn a_settlement_moves_a_waiting_tenant_in_the_order() {
        let mut q = Q::new();
        q.push(1, 1.0);
        q.push(2, 1.0);
        q.q.charge(Share { tenant: 1, weight: 1.0 }, 1000.0);
        assert_eq!(q.q.front().expect("front").share.tenant, 2, "tenant 1 was served more");
        // Its request ended far shorter than reserved: most comes back.
        q.q.settle(Share { tenant: 1, weight: 1.0 }, -990.0);
        q.q.charge(Share { tenant: 2, weight: 1.0 }, 100.0);
        assert_eq!(q.q.front().expect("front").share.tenant, 1);
    }

    #[test]
    fn a_tenant_that_leaves_and_returns_gets_no_burst_of_credit() {
        let mut q = Q::new();
        // Tenant 1 alone for a long time: served a lot.
        for _ in 0..100 {
            q.push(1, 1.0);
            q.serve(100.0);
        }
        // Tenant 2 was away all along; it comes back next to tenant 1.
        for _ in 0..10 {
            q.push(1, 1.0);
        }
        for _ in 0..10 {
            q.push(2, 1.0);
        }
        let served: Vec<u32> = (0..10).map(|_| q.serve(100.0)).collect();
        let twos = served.iter().filter(|&&t| t == 2).count();
        assert!((4..=6).contains(&twos), "an even split from its return, not ten in a row: {served:?}");
        // The same when it comes back to an empty queue, tenant 1 arriving right after.
        let mut q = Q::new();
        for _ in 0..100 {
            q.push(1, 1.0);
            q.serve(100.0);
        }
        q.push(2, 1.0);
        for _ in 0..10 {
            q.push(1, 1.0);
        }
        for _ in 0..9 {
            q.push(2, 1.0);
        }
        let served: Vec<u32> = (0..10).map(|_| q.serve(100.0)).collect();
        let twos = served.iter().filter(|&&t| t == 2).count();
        assert!((4..=6).contains(&twos), "{served:?}");
    }

    #[test]
    fn a_tenant_sending_now_and_then_is_served_at_the_next_free_slot() {
        let mut q = Q::new();
        // Tenant 1 keeps a backlog; tenant 2 sends one request at a time.
        for _ in 0..20 {
            q.push(1, 1.0);
        }
        for round in 0..5 {
            q.serve(100.0);
            q.push(2, 1.0);
            assert_eq!(q.serve(100.0), 2, "round {round}: ahead of tenant 1's next request");
            q.push(1, 1.0);
        }
    }

    #[test]
    fn a_tenant_under_its_share_of_the_slots_is_known_in_constant_time() {
        let mut q = Q::new();
        let (a, b) = (Share { tenant: 1, weight: 1.0 }, Share { tenant: 2, weight: 3.0 });
        // Alone, a tenant is never under its share: there is nobody to yield.
        assert!(!q.q.under_share(a, 8));
        for _ in 0..6 {
            q.q.charge(a, 10.0);
        }
        assert!(!q.q.under_share(a, 8), "alone with 6 of 8");
        // B arrives (weight 3 of 4: 6 of 8 slots are its part) with nothing running.
        assert!(q.q.under_share(b, 8));
        for _ in 0..5 {
            q.q.charge(b, 10.0);
        }
        assert!(q.q.under_share(b, 8), "5 < 6");
        q.q.charge(b, 10.0);
        assert!(!q.q.under_share(b, 8), "6 = its part");
        assert!(!q.q.under_share(a, 8), "A holds 6, its part is 2");
        // A tenant that only waits counts as active too.
        q.push(3, 1.0);
        assert!(q.q.under_share(Share { tenant: 3, weight: 1.0 }, 8), "nothing running, 8/5 its part");
        // Ends take tenants out again: B alone is not under its share.
        for _ in 0..6 {
            q.q.ended(a);
        }
        q.q.remove(3, q.next).expect("queued");
        assert!(!q.q.under_share(b, 8), "alone again");
        for _ in 0..6 {
            q.q.ended(b);
        }
        assert_eq!(q.q.active_weight, 0.0);
        assert!(q.q.activity.is_empty());
    }

    #[test]
    fn removal_and_arrival_order_hold_across_tenants() {
        let mut q = Q::new();
        q.push(1, 1.0); // id 1
        q.push(2, 1.0); // id 2
        q.push(1, 1.0); // id 3
        assert_eq!(q.q.oldest().map(|w| w.id), Some(1));
        assert_eq!(q.q.by_arrival().collect::<Vec<_>>(), vec![(1, 1), (2, 2), (3, 1)]);
        assert_eq!(q.q.remove(1, 1).map(|w| w.id), Some(1));
        assert_eq!(q.q.remove(1, 1).map(|w| w.id), None, "once");
        assert_eq!(q.q.oldest().map(|w| w.id), Some(2));
        assert_eq!(q.q.remove(2, 2).map(|w| w.id), Some(2));
        assert_eq!(q.q.len(), 1);
        assert_eq!(q.q.front().map(|w| w.id), Some(3));
        q.serve(1.0);
        assert!(q.q.is_empty() && q.q.front().is_none() && q.q.oldest().is_none());
    }
}
