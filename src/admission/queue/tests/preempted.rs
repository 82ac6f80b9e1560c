//! A preempted stream waiting for a slot again.

use super::*;
use crate::upstream::prefix::RouteKey;

/// A preempted stream waits first in its tenant's line, and takes the next
/// slot freed wherever it is: not passed over for the waiters behind it
/// whose prompt's prefix is cached where that slot is.
#[tokio::test(start_paused = true)]
async fn a_preempted_stream_takes_the_next_slot_before_waiters_whose_prefix_is_cached_there() {
    let pool = replicas_with(2, 1, tiers(0.0, 10, 10), false);
    let text = "a system prompt every batch request of this job shares ".repeat(12);
    let key = Arc::new(RouteKey::of(&[text.as_bytes()], 256, 512, None));
    // One slot on each replica; the first holds the job's prefix.
    let cached = pool.admit(Tier::Batch, 0, Claim::default(), Some(key.clone())).await.expect("a free slot").lease;
    let other = take(&pool, Tier::Batch).await;
    let p = pool.clone();
    let resumed = Claim { resumed: true, ..Claim::default() };
    let preempted = tokio::spawn(async move { p.admit(Tier::Batch, 0, resumed, None).await });
    settle().await;
    let mut behind = Vec::new();
    for _ in 0..3 {
        let p = pool.clone();
        let k = key.clone();
        behind.push(tokio::spawn(async move { p.admit(Tier::Batch, 0, Claim::default(), Some(k)).await }));
        settle().await;
    }
    assert_eq!(pool.depth(Tier::Batch), 4);
    // The slot where the prefix is cached frees.
    drop(cached);
    settle().await;
    assert!(preempted.is_finished(), "the preempted stream took it");
    assert!(behind.iter().all(|h| !h.is_finished()), "those behind it wait");
    assert!(preempted.await.expect("task").is_ok());
    drop(other);
    settle().await;
    assert!(behind[0].is_finished(), "then the next in line");
}
