//! Batch leaves interactive requests time for their first token on an
//! engine that serves first come, first served (docs/design/preemption.md,
//! rule 14).

use super::*;
use crate::upstream::prefix::RouteKey;

/// A prompt of 3 KiB that no other shares (its first block is its own).
fn prompt(n: usize) -> Option<Arc<RouteKey>> {
    let text = format!("{n:06} {}", "a prompt of its own ".repeat(160));
    Some(Arc::new(RouteKey::of(&[&text.as_bytes()[..3072]], 256, 512, None)))
}

/// Teach the replica that 3 KiB of prefill takes 100 ms to a first token
/// (three interactive requests of a 300 ms class, one after the other),
/// as the request path does when their first tokens come.
async fn teach(pool: &Arc<PoolAdmission>) {
    for n in 0..3 {
        let mut lease = pool.admit(Tier::Interactive, 0, Claim::default(), prompt(n)).await.expect("a free slot").lease;
        lease.interactive_target(Duration::from_millis(300));
        tokio::time::advance(Duration::from_millis(100)).await;
        lease.first_token();
    }
}

async fn batch(pool: &Arc<PoolAdmission>, n: usize) -> tokio::task::JoinHandle<Result<Granted, Refusal>> {
    let p = pool.clone();
    let h = tokio::spawn(async move { p.admit(Tier::Batch, 0, Claim::default(), prompt(n)).await });
    settle().await;
    h
}

/// A batch prompt alone goes at once; the next waits while the first is
/// prefilled (an interactive request sent after both would be predicted
/// its first token at 300 ms, past half its target), with slots free, and
/// goes at the first one's first token.
#[tokio::test(start_paused = true)]
async fn a_batch_prompt_waits_for_the_prefill_ahead_where_it_would_make_the_next_chat_late() {
    let pool = pool(8, tiers(0.0, 10, 10));
    teach(&pool).await;
    let first = batch(&pool, 10).await;
    assert!(first.is_finished(), "nothing ahead of it: it goes");
    let mut first = first.await.expect("task").expect("a slot").lease;
    let second = batch(&pool, 11).await;
    assert!(!second.is_finished(), "held, though 7 slots are free");
    assert_eq!(pool.depth(Tier::Batch), 1, "it waits in the batch queue");
    tokio::time::advance(Duration::from_millis(100)).await;
    first.first_token();
    settle().await;
    assert!(second.is_finished(), "the prefill ahead is done: it goes");
    assert!(second.await.expect("task").is_ok());
}

/// Nothing is held where the engine orders its queue by priority, in a
/// fleet, nor where no interactive request came lately (batch alone fills
/// the slots).
#[tokio::test(start_paused = true)]
async fn batch_is_not_held_under_priorities_in_a_fleet_nor_while_it_is_alone() {
    let prioritised = pool_with(8, tiers(0.0, 10, 10), true);
    teach(&prioritised).await;
    let alone = pool(8, tiers(0.0, 10, 10));
    for p in [&prioritised, &alone] {
        let sent = [batch(p, 10).await, batch(p, 11).await, batch(p, 12).await];
        assert!(sent.iter().all(|h| h.is_finished()), "all three go at once");
    }
    // In a fleet (this instance's part of the slots set), nothing is held.
    let fleet = pool(8, tiers(0.0, 10, 10));
    teach(&fleet).await;
    fleet.pool().replicas[0].set_fleet_share(Some((8, 0)));
    let (_a, b) = (batch(&fleet, 10).await, batch(&fleet, 11).await);
    assert!(b.is_finished(), "in a fleet: not held");
    // Past the outlook's memory, a pool that held batch holds it no more.
    let forgets = pool(8, tiers(0.0, 10, 10));
    teach(&forgets).await;
    tokio::time::advance(Duration::from_secs(31)).await;
    let (_a, b) = (batch(&forgets, 10).await, batch(&forgets, 11).await);
    assert!(b.is_finished(), "no interactive request for 31 s: not held");
}

/// Interactive prompts being prefilled never keep a batch prompt out: only
/// another batch prompt's prefill does, so batch is never starved by a
/// steady stream of chat.
#[tokio::test(start_paused = true)]
async fn chat_prompts_ahead_do_not_hold_a_batch_prompt() {
    let pool = pool(8, tiers(0.0, 10, 10));
    teach(&pool).await;
    let mut chats = Vec::new();
    for n in 20..23 {
        let lease = pool.admit(Tier::Interactive, 0, Claim::default(), prompt(n)).await.expect("a free slot").lease;
        lease.interactive_target(Duration::from_millis(300));
        chats.push(lease);
    }
    let b = batch(&pool, 10).await;
    assert!(b.is_finished(), "three chat prompts ahead (a first token predicted at 400 ms), no batch one: it goes");
    let next = batch(&pool, 11).await;
    assert!(!next.is_finished(), "a batch prompt ahead as well: the next is held");
}
