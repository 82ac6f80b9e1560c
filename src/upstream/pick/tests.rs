//! Routing's rules, as `pick` applies them.

use super::*;
use crate::config::{InflightLimit, PoolConfig};
use crate::upstream::Access;

/// `n` healthy replicas (nothing listens) with `slots` each, prefix-aware,
/// blocks of 16 bytes.
fn pool(n: usize, slots: u32, load_weight: f64) -> Pool {
    pool_ordering(n, slots, load_weight, false)
}

/// [`pool`] of engines that run interactive requests first, or not.
fn pool_ordering(n: usize, slots: u32, load_weight: f64, upstream_priority: bool) -> Pool {
    let mut cfg = PoolConfig {
        replicas: (0..n).map(|i| format!("http://127.0.0.1:{}", 9 + i).into()).collect(),
        max_inflight_per_replica: InflightLimit::Fixed(slots),
        upstream_priority,
        ..PoolConfig::default()
    };
    cfg.prefix.block = crate::config::Size(16);
    cfg.prefix.load_weight = load_weight;
    let access = Access::new(&cfg).expect("access");
    let pool = Pool::new(cfg, access, None);
    for r in &pool.replicas {
        r.set_healthy(true);
    }
    pool
}

fn key(text: &str) -> RouteKey {
    RouteKey::of(&[text.as_bytes()], 16, 512, None)
}

/// `n` interactive requests for `k`'s prompt, each past its prefill.
fn prefilled(pool: &Pool, k: &RouteKey, n: usize) -> Vec<ReplicaSlot> {
    (0..n)
        .map(|_| {
            let mut s = pool.pick(None, Room::Over(0), Tier::Interactive, Some(k)).expect("slot");
            s.prefilled();
            s
        })
        .collect()
}

fn at(pool: &Pool, slot: &ReplicaSlot) -> usize {
    pool.replicas.iter().position(|r| Arc::ptr_eq(r, slot.replica())).expect("one of the pool's")
}

/// A prompt of a long shared part (`system`) and a question of its own.
fn prompt(system: char, question: usize) -> String {
    let mut s: String = std::iter::repeat_n(system, 1600).collect();
    s.push_str(&format!("question {question:06}"));
    s
}

#[test]
fn a_prompt_goes_where_its_prefix_went_and_cold_ones_go_to_their_home() {
    let pool = pool(4, 100, 1.0);
    // One of a fleet: the home breaks ties.
    pool.prefix.set_journaling(true);
    let mut replicas_used = std::collections::BTreeSet::new();
    for system in ['a', 'b', 'c', 'd', 'e', 'f'] {
        // The replicas equally loaded (idle), the first of each group
        // goes to the group's home: the same replica whichever instance
        // picks, whatever the rotation.
        let mut held = Vec::new();
        let k = key(&prompt(system, 0));
        let first = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&k)).expect("slot");
        let home = home(k.anchor().expect("named"), pool.url_keys.iter().copied().enumerate()).expect("a home");
        assert_eq!(at(&pool, &first), home, "group {system}");
        // Its first token came: no prefill ahead there now.
        let mut first = first;
        first.prefilled();
        held.push(first);
        for q in 1..5 {
            let mut s = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&key(&prompt(system, q)))).expect("slot");
            assert_eq!(at(&pool, &s), home, "group {system}, question {q}: where its system prompt is");
            s.prefilled();
            held.push(s);
        }
        replicas_used.insert(home);
    }
    assert!(replicas_used.len() >= 2, "six groups, several homes: {replicas_used:?}");
    // The estimate is counted where it went: four of each five found their prefix.
    let (expected, _) = pool.replicas[*replicas_used.first().expect("one")].hit_ratios();
    assert!(expected.is_some_and(|x| x > 0.5), "{expected:?}");
}

#[test]
fn alone_cold_prompts_on_idle_replicas_go_round() {
    let pool = pool(4, 100, 1.0);
    let used: std::collections::BTreeSet<_> = ['p', 'q', 'r', 's']
        .into_iter()
        .map(|c| at(&pool, &pool.pick(None, Room::Over(0), Tier::Interactive, Some(&key(&prompt(c, 0)))).expect("slot")))
        .collect();
    assert_eq!(used.len(), 4, "each idle in turn, whatever the prompts' homes: {used:?}");
}

#[test]
fn a_hot_prefix_spills_to_another_replica_when_the_prefill_queued_there_outweighs_its_cache() {
    let pool = pool(2, 1000, 0.0);
    let hot = |q| key(&prompt('h', q));
    let mut first = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&hot(0))).expect("slot");
    let home = at(&pool, &first);
    first.prefilled();
    // Requests without a first token pile up there, each adding its own
    // question (15 bytes past the 100 cached blocks) to the prefill
    // ahead. The other replica, cold, costs a whole prompt: 1615 bytes.
    // The home costs 15 per request ahead, plus 15: more from the 108th.
    let mut held = vec![first];
    let mut spilled_at = None;
    for q in 1..200 {
        let s = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&hot(q))).expect("slot");
        if at(&pool, &s) != home {
            spilled_at = Some(q);
            break;
        }
        held.push(s);
    }
    assert_eq!(spilled_at, Some(108));
    // Once both hold it, it alternates by the work ahead.
    let next = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&hot(500))).expect("slot");
    assert_ne!(at(&pool, &next), home, "the other holds it now and has less queued");
    drop(held);
}

#[test]
fn load_weighs_against_the_cache_and_a_full_replica_is_passed_over() {
    let pool = pool(2, 3, 1.0);
    let k = key(&prompt('x', 0));
    let mut held = prefilled(&pool, &k, 3);
    let home = at(&pool, &held[0]);
    assert!(held.iter().all(|s| at(&pool, s) == home), "cached, and 3 streams weigh less than the prefix");
    // Its three slots are full: the prompt cached there and nowhere
    // else, it may go half of them (two) above.
    for _ in 0..2 {
        let mut s = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&k)).expect("slot");
        assert_eq!(at(&pool, &s), home, "above the limit where the prompt is cached");
        s.prefilled();
        held.push(s);
    }
    // Past that, the next goes to the other replica; batch never goes above.
    let s = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&k)).expect("slot");
    assert_ne!(at(&pool, &s), home);
    drop(s);
    let b = pool.pick(None, Room::Over(0), Tier::Batch, Some(&k)).expect("slot");
    assert_ne!(at(&pool, &b), home);
}

#[test]
fn a_full_replica_takes_no_one_above_its_limit_whose_prompt_is_as_cached_elsewhere() {
    let pool = pool(2, 2, 1.0);
    // Not prefix-bound: no prompt, or a prompt both hold.
    let a = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
    let b = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
    let c = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
    let d = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
    assert!(pool.pick(None, Room::Over(0), Tier::Interactive, None).is_err(), "both full, no prompt: none above");
    drop((a, b, c, d));
    let k = key(&prompt('y', 0));
    // Three on its home (one above), then two on the other: it spilled, both hold it.
    // (A prompt of 1615 bytes: 1600 held on its home, none elsewhere.)
    let held = prefilled(&pool, &k, 5);
    let on: Vec<_> = held.iter().map(|s| at(&pool, s)).collect();
    assert_eq!(on.iter().filter(|&&i| i == on[0]).count(), 3, "{on:?}");
    // Both full, both holding it: the first one full is not taken above.
    assert!(pool.pick(None, Room::Over(0), Tier::Interactive, Some(&k)).is_err());
}

#[test]
fn where_the_engine_runs_interactive_first_a_full_replica_takes_one_above_rather_than_a_prompt_more_prefill_elsewhere() {
    for priority in [true, false] {
        let pool = pool_ordering(2, 3, 0.0, priority);
        // Prompts with nothing in common: none is cached anywhere.
        let unshared = |q: u8| key(&prompt(char::from(b'a' + q), 0));
        let (a, b) = (&pool.replicas[0], &pool.replicas[1]);
        let on = |r: &Arc<Replica>, q: u8| {
            let other = if Arc::ptr_eq(r, a) { b } else { a };
            let s = pool.pick(Some(other), Room::Over(0), Tier::Interactive, Some(&unshared(q))).expect("slot");
            assert!(Arc::ptr_eq(s.replica(), r));
            s
        };
        // `a` full, its streams past their prefill; `b` with a seat
        // free and an unshared prompt still prefilling (its own, and
        // this one's: twice `a`'s cost).
        let mut held: Vec<_> = (0..3).map(|q| on(a, q)).collect();
        held.extend((3..5).map(|q| on(b, q)));
        for s in &mut held[..4] {
            s.prefilled();
        }
        // `a`'s engine runs all it was ever seen running: above its
        // limit the request would wait there for a slot to free.
        a.readings.saw_running(64.0);
        a.readings.set_scraped_total(Some(64.0));
        let chat = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&unshared(8))).expect("slot");
        assert!(Arc::ptr_eq(chat.replica(), b), "priority {priority}: at its slots, not above");
        drop(chat);
        // Its cache bounds it now (40 run): it takes a request in at once.
        a.readings.set_scraped_total(Some(40.0));
        let chat = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&unshared(9))).expect("slot");
        let want = if priority { a } else { b };
        assert!(
            Arc::ptr_eq(chat.replica(), want),
            "priority {priority}: to the replica with less interactive prefill ahead only where the engine orders by it"
        );
        drop(chat);
        // Batch never goes above; and where `b` is full too, neither
        // does interactive: it waits for a slot.
        let batch = pool.pick(None, Room::Over(0), Tier::Batch, Some(&unshared(10))).expect("slot");
        assert!(Arc::ptr_eq(batch.replica(), b));
        assert!(pool.pick(None, Room::Over(0), Tier::Interactive, Some(&unshared(11))).is_err(), "priority {priority}");
    }
}

#[test]
fn a_session_hint_keeps_a_conversation_on_its_replica() {
    let pool = pool(4, 100, 1.0);
    let turn = |text: &str| RouteKey::of(&[text.as_bytes()], 16, 512, Some(b"conversation-7"));
    let first = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&turn("hi"))).expect("slot");
    let home = at(&pool, &first);
    drop(first);
    // Later turns, short or with other text first, stay there.
    for text in ["and then?", "a completely different opening that is longer than a block or two"] {
        let s = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&turn(text))).expect("slot");
        assert_eq!(at(&pool, &s), home, "{text}");
    }
}

#[test]
fn without_a_prompt_prefix_aware_ranks_as_least_loaded() {
    let pool = pool(2, 10, 1.0);
    let a = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
    let b = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
    assert_ne!(at(&pool, &a), at(&pool, &b), "the one prefilling is passed over");
}
