//! What a fleet's other instances hear at once (docs/design/fleet.md,
//! rule 15): interactive requests starting to wait or none waiting any
//! more, and, while theirs wait, a slot given back here.

use super::*;

/// Whether news came since the last look, marking it seen.
fn heard(news: &mut tokio::sync::watch::Receiver<u64>) -> bool {
    let told = news.has_changed().expect("the beacon lives");
    news.borrow_and_update();
    told
}

#[tokio::test(start_paused = true)]
async fn chat_starting_to_wait_and_the_last_leaving_are_news_and_nothing_in_between() {
    let pool = pool(1, tiers(0.0, 10, 10));
    let mut news = pool.news();
    let held = take(&pool, Tier::Batch).await;
    assert!(!heard(&mut news), "a slot taken is no news");
    let batch = queued(&pool, Tier::Batch).await;
    assert!(!heard(&mut news), "batch waiting is no news");
    let before = pool.news_count();
    let first = queued(&pool, Tier::Interactive).await;
    assert!(heard(&mut news), "the first interactive request waiting is news");
    assert_ne!(pool.news_count(), before, "and moves the count a reader passes back");
    let second = queued(&pool, Tier::Interactive).await;
    assert!(!heard(&mut news), "one more waiting is not");
    second.abort();
    settle().await;
    assert!(!heard(&mut news), "one of two leaving is not");
    first.abort();
    settle().await;
    assert!(heard(&mut news), "the last leaving is: the others may take free seats again");
    batch.abort();
    drop(held);
    settle().await;
    assert!(!heard(&mut news), "a slot freed while no other instance's chat waits is no news");
}

#[tokio::test(start_paused = true)]
async fn a_slot_given_back_while_the_others_chat_waits_is_news() {
    let pool = pool(2, tiers(0.0, 10, 10));
    let mut news = pool.news();
    let (a, b) = (take(&pool, Tier::Batch).await, take(&pool, Tier::Batch).await);
    pool.set_others_wait(true);
    drop(a);
    assert!(heard(&mut news), "their waiting chat may take the seat now");
    pool.set_others_wait(false);
    drop(b);
    assert!(!heard(&mut news), "not once none waits there");
}
