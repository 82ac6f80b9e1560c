//! Tenants: keys, their limits per minute, day and month, and their shares.

use super::*;
use crate::config::KeyLimitsConfig;
use crate::telemetry::Outcome;

fn tenant(limits: KeyLimitsConfig) -> (Tenants, Arc<Tenant>) {
    let tenants = Tenants::new(Arc::new(Metrics::new(&crate::config::Config::default())));
    let c = TenantConfig { weight: 1.0, limits: Some(limits) };
    let t = tenants.prepare("team-a", &c);
    tenants.install([(&t, c)]);
    (tenants, t)
}

fn rpm(n: u64) -> KeyLimitsConfig {
    KeyLimitsConfig { requests_per_minute: Some(n), ..KeyLimitsConfig::default() }
}

#[tokio::test(start_paused = true)]
async fn requests_per_minute_is_a_sliding_minute_with_its_headers() {
    let (_t, a) = tenant(rpm(3));
    let mut held = Vec::new();
    for left in [2, 1, 0] {
        let (p, state) = a.admit(Instant::now(), 0).expect("under the limit");
        assert_eq!(state.requests.map(|q| (q.limit, q.remaining)), Some((3, left)));
        held.push(p);
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    // 30 s in: the first request leaves the window at 60 s.
    let no = a.admit(Instant::now(), 0).expect_err("a fourth within the minute");
    assert_eq!((no.limit, no.retry_after, no.too_large), (Limit::Requests, 30, false));
    assert_eq!(no.state.requests.map(|q| (q.remaining, q.reset)), Some((0, Duration::from_secs(50))));
    drop(held);
    tokio::time::advance(Duration::from_secs(30)).await;
    assert!(a.admit(Instant::now(), 0).is_ok(), "the first one left the window");
    assert!(a.admit(Instant::now(), 0).is_err(), "but only that one");
    assert!(a.limited_lately(Instant::now()));
    assert_eq!(a.limited_counts(), [2, 0, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn tokens_are_reserved_at_admission_and_settled_to_usage() {
    let (_t, a) = tenant(KeyLimitsConfig { tokens_per_minute: Some(1000), ..KeyLimitsConfig::default() });
    let (mut p1, s1) = a.admit(Instant::now(), 600).expect("600 of 1000");
    assert_eq!(s1.tokens.map(|q| q.remaining), Some(400));
    // Reserved, not yet used: a second 600 does not fit while the first streams.
    let no = a.admit(Instant::now(), 600).expect_err("1200 > 1000");
    assert_eq!(no.limit, Limit::Tokens);
    // The first ends having used 150: the rest comes back.
    p1.settle(150);
    drop(p1);
    let (_p2, s2) = a.admit(Instant::now(), 600).expect("150 + 600 fits");
    assert_eq!(s2.tokens.map(|q| q.remaining), Some(250));
    // A request bigger than the whole minute can never pass.
    let big = a.admit(Instant::now(), 1001).expect_err("too large");
    assert!(big.too_large);
    // Used more than reserved: charged in full.
    tokio::time::advance(Duration::from_secs(61)).await;
    let (mut p3, _) = a.admit(Instant::now(), 100).expect("a fresh minute");
    p3.settle(900);
    drop(p3);
    assert_eq!(a.rates_now(Instant::now()).tokens.map(|q| q.remaining), Some(100));
}

/// The permit settles the finished request: refunded when the gateway
/// refused it after the key's limits, settled to what it took (the
/// tracker's count), the reservation standing when that is unknown.
#[tokio::test(start_paused = true)]
async fn a_permit_judges_the_finished_request() {
    let (_t, a) = tenant(KeyLimitsConfig { tokens_per_minute: Some(1000), ..KeyLimitsConfig::default() });
    let left = |a: &Tenant| a.rates_now(Instant::now()).tokens.map(|q| q.remaining);
    let refused = Finished { admitted: false, ..Finished::example(Outcome::rejected, true) };
    let (mut p, _) = a.admit(Instant::now(), 600).expect("600 of 1000");
    p.finished(refused.admitted, Some(50));
    drop(p);
    assert_eq!(left(&a), Some(1000), "refused after the limits: counts for nothing");
    let (mut p, _) = a.admit(Instant::now(), 600).expect("600 of 1000");
    p.finished(true, Some(110));
    drop(p);
    assert_eq!(left(&a), Some(890), "settled to 10 prompt + 100 completion tokens");
    let (mut p, _) = a.admit(Instant::now(), 300).expect("300 more");
    p.finished(true, None);
    drop(p);
    assert_eq!(left(&a), Some(590), "no usage reported: the 300 reserved stand");
}

/// The tenant judges the finished request: its outcome, tokens and
/// goodput counted, its queue time observed only when it got a slot,
/// and its minute's SLO tally (excluded outcomes not judged).
#[tokio::test(start_paused = true)]
async fn a_tenant_judges_the_finished_request() {
    let (_t, a) = tenant(rpm(100));
    a.finished(&Finished::example(Outcome::ok, true));
    let slow = Finished::example(Outcome::ok, true);
    a.finished(&Finished { first_token: Some(slow.start + Duration::from_secs(1)), ..slow });
    a.finished(&Finished { admitted: false, usage: None, ..Finished::example(Outcome::cancelled, true) });
    let m = a.series().expect("installed");
    assert_eq!((m.outcome(Outcome::ok).get(), m.outcome(Outcome::cancelled).get()), (2, 1));
    assert_eq!((m.prompt_tokens.get(), m.completion_tokens.get(), m.goodput.get()), (20, 200, 1));
    assert_eq!(m.queue_time.count(), 2, "the one that never got a slot has no queue time");
    let (served, judged, met) = a.last_minute(Instant::now());
    assert_eq!((served, judged, met), (220.0, 2.0, 1.0), "the hang-up is not judged");
}

#[tokio::test(start_paused = true)]
async fn max_concurrent_counts_requests_until_their_permit_goes() {
    let (_t, a) = tenant(KeyLimitsConfig { max_concurrent: Some(2), ..KeyLimitsConfig::default() });
    let p1 = a.admit(Instant::now(), 10).expect("1");
    let _p2 = a.admit(Instant::now(), 10).expect("2");
    assert_eq!(a.admit(Instant::now(), 10).expect_err("3").limit, Limit::Concurrent);
    drop(p1);
    let _p3 = a.admit(Instant::now(), 10).expect("one ended: room again");
    assert_eq!(a.concurrent(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_fleet_splits_a_keys_limits_among_its_live_instances() {
    let (tenants, a) = tenant(KeyLimitsConfig {
        requests_per_minute: Some(10),
        tokens_per_minute: Some(3000),
        max_concurrent: Some(4),
        ..KeyLimitsConfig::default()
    });
    tenants.set_instances(3);
    assert_eq!(
        a.limits(),
        Limits { requests_per_minute: Some(3), tokens_per_minute: Some(1000), max_concurrent: Some(1), quotas: [None; 4] },
        "each instance its third, at least one"
    );
    for _ in 0..3 {
        a.admit(Instant::now(), 0).map(drop).expect("3 of 10/3");
    }
    assert_eq!(a.admit(Instant::now(), 0).expect_err("a fourth").limit, Limit::Requests);
    tenants.set_instances(1);
    assert!(a.admit(Instant::now(), 0).is_ok(), "alone again: the whole limit");
}

#[test]
fn a_reload_keeps_a_tenants_state_and_changes_its_settings_only_at_install() {
    let tenants = Tenants::new(Arc::new(Metrics::new(&crate::config::Config::default())));
    let one = TenantConfig { weight: 1.0, limits: None };
    let two = TenantConfig { weight: 2.0, limits: Some(rpm(5)) };
    let a = tenants.prepare("a", &one);
    let unused = tenants.prepare("a", &one);
    assert!(!Arc::ptr_eq(&a, &unused), "not known before its config is installed");
    tenants.install([(&a, one)]);
    let again = tenants.prepare("a", &two);
    assert!(Arc::ptr_eq(&a, &again), "same tenant across configs");
    assert_eq!((a.weight(), a.has_limits()), (1.0, false), "prepare changes nothing live");
    tenants.install([(&again, two)]);
    assert_eq!((a.weight(), a.has_limits()), (2.0, true));
    let b = tenants.prepare("b", &one);
    assert_ne!(a.share().tenant, b.share().tenant);
}

#[tokio::test(start_paused = true)]
async fn a_day_quota_settles_to_usage_comes_back_at_midnight_and_splits_in_a_fleet() {
    // 400 s before a midnight (UTC).
    let tenants = Tenants::at(Arc::new(Metrics::new(&crate::config::Config::default())), 86_400 * 20_000 - 400);
    let c = TenantConfig { weight: 1.0, limits: Some(KeyLimitsConfig { tokens_per_day: Some(100), ..KeyLimitsConfig::default() }) };
    let a = tenants.prepare("a", &c);
    tenants.install([(&a, c)]);
    let (mut p, state) = a.admit(Instant::now(), 80).expect("80 of 100");
    assert_eq!(state.tokens.map(|q| (q.limit, q.remaining, q.reset)), Some((100, 20, Duration::from_secs(400))));
    p.settle(90);
    drop(p);
    let no = a.admit(Instant::now(), 20).expect_err("90 used + 20 > 100");
    assert_eq!((no.limit, no.retry_after, no.too_large), (Limit::Quota, 400, false));
    assert_eq!(no.state.tokens.map(|q| q.remaining), Some(10));
    assert!(a.admit(Instant::now(), 101).expect_err("more than a day's").too_large);
    tokio::time::advance(Duration::from_secs(400)).await;
    a.admit(Instant::now(), 100).map(drop).expect("a new day, the whole quota");
    tenants.set_instances(2);
    assert_eq!(a.limits().quotas, [None, Some(50), None, None], "each instance its half");
    assert_eq!(a.limited_counts(), [0, 0, 0, 2]);
}

#[test]
fn reset_headers_read_like_openais() {
    assert_eq!(reset_text(Duration::from_millis(250)), "250ms");
    assert_eq!(reset_text(Duration::from_secs(1)), "1s");
    assert_eq!(reset_text(Duration::from_secs(360)), "6m0s");
    assert_eq!(reset_text(Duration::from_secs(59)), "59s");
}

#[test]
fn fairness_ids_are_tenants_of_their_own_up_to_the_cap_then_share_one() {
    let tenants = Tenants::new(Arc::new(Metrics::new(&crate::config::Config::default())));
    let a = tenants.flow("team-a");
    assert!(Arc::ptr_eq(&a, &tenants.flow("team-a")), "the same id is the same tenant");
    assert_eq!(&*a.name, "team-a");
    assert_eq!(a.weight(), 1.0);
    assert!(!a.has_limits());
    for i in 1..MAX_FLOWS {
        assert_eq!(&*tenants.flow(&format!("flow-{i}")).name, format!("flow-{i}"));
    }
    let past = tenants.flow("one-too-many");
    assert_eq!(&*past.name, OTHER_FLOWS);
    assert!(Arc::ptr_eq(&past, &tenants.flow("another")), "the ids past the cap share one tenant");
    assert!(Arc::ptr_eq(&a, &tenants.flow("team-a")), "ids seen before keep theirs");
}
