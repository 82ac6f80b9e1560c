//! How a fleet divides each replica's slots among its instances: plain
//! functions of what each instance said, so every instance computes the
//! same split from the same inputs. The rules are docs/design/fleet.md's.

use std::sync::Arc;

use tokio::time::Instant;

use super::wire::{PoolState, State};
use crate::admission::seats::{Demand, Reserve};
use crate::config::FleetConfig;

/// An instance's interactive reservation scaled to its part of the fleet's
/// peak, never below what it has now.
fn scaled(reserve: usize, now: usize, scale: f64) -> usize {
    ((reserve as f64 * scale).ceil() as usize).max(now)
}

/// How much of each instance's interactive demand the split meets before
/// batch's: the instances' peaks (`peaks`, summed) together count for what
/// the fleet keeps for interactive requests (`kept`: its reservation, as one
/// instance holding every slot would keep) and no more, so the slots past
/// it follow where batch waits. Counted whole, peaks that together pass the
/// slots gave interactive every slot, and the parts ignored batch. What an
/// instance holds and waits for now always counts (see [`scaled`]).
pub(crate) fn interactive_scale(kept: usize, peaks: usize) -> f64 {
    if peaks == 0 {
        1.0
    } else {
        (kept as f64 / peaks as f64).min(1.0)
    }
}

/// This instance's part of the fleet's reservation `whole`. `weights`: each
/// heard member's id and interactive demand, this instance first. Each of
/// the reservation's numbers is shared by demand (evenly while nobody has
/// any) and rounded so that the members' parts add up to it: largest
/// remainders first, ties to the lower id, so every instance computes the
/// same parts.
pub(crate) fn reserve_part(whole: Reserve, weights: &[(&str, usize)]) -> Reserve {
    Reserve { normal: portion(whole.normal, weights), at_risk: portion(whole.at_risk, weights), headroom: portion(whole.headroom, weights) }
}

/// The first member's part of `total` shared by `weights` (see [`reserve_part`]).
fn portion(total: usize, weights: &[(&str, usize)]) -> usize {
    if weights.is_empty() {
        return total;
    }
    let even = weights.iter().all(|w| w.1 == 0);
    let weight = |i: usize| if even { 1 } else { weights[i].1 };
    let sum: usize = (0..weights.len()).map(weight).sum();
    let floor = |i: usize| total * weight(i) / sum;
    let remainder = |i: usize| total * weight(i) % sum;
    let left = total - (0..weights.len()).map(floor).sum::<usize>();
    let mut rank: Vec<usize> = (0..weights.len()).collect();
    rank.sort_by(|&a, &b| remainder(b).cmp(&remainder(a)).then(weights[a].0.cmp(weights[b].0)));
    floor(0) + rank.iter().take(left).any(|&i| i == 0) as usize
}

/// What a peer counts for at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Standing {
    /// Heard within `peer_timeout`.
    Fresh(Arc<State>),
    /// Not heard for `peer_timeout`, nor for `takeover_after`: keeps what it
    /// last said it held (if it ever said), at least an equal share.
    Lost(Option<Arc<State>>),
    /// Not heard for `takeover_after`: taken for dead.
    Gone,
}

impl Standing {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Standing::Fresh(_) => "fresh",
            Standing::Lost(_) => "lost",
            Standing::Gone => "gone",
        }
    }
}

/// How a peer heard at `heard` (never: `None`; a peer since `since`) stands at `now`.
pub(crate) fn standing(config: &FleetConfig, since: Instant, heard: Option<(Instant, &Arc<State>)>, now: Instant) -> Standing {
    let last = heard.map(|(t, _)| t).unwrap_or(since);
    let quiet = now.saturating_duration_since(last);
    match heard {
        Some((_, s)) if quiet < config.peer_timeout.get() => Standing::Fresh(s.clone()),
        _ if quiet < config.takeover_after.get() => Standing::Lost(heard.map(|(_, s)| s.clone())),
        _ => Standing::Gone,
    }
}

/// One replica as this instance sees it, for [`split`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Local {
    pub(crate) healthy: bool,
    pub(crate) inflight: usize,
    pub(crate) limit: usize,
    /// What the replica runs and queues for all its clients, when scraped.
    pub(crate) scraped: Option<u64>,
}

/// This instance's part of one replica: slots it may hold, and the
/// requests the others hold (or are assumed to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) slots: usize,
    pub(crate) others: usize,
    /// The replica's limit for the whole fleet (rule 4).
    pub(crate) limit: usize,
}

/// A replica's limit for the whole fleet (rule 4): the smallest that this
/// instance (`own`) and the heard `peers` learned for it.
pub(crate) fn fleet_limit<'a>(url: &str, own: usize, peers: impl IntoIterator<Item = &'a PoolState>) -> usize {
    peers.into_iter().filter_map(|p| p.replicas.iter().find(|r| r.url == url)).filter(|x| x.healthy).map(|x| x.limit).fold(own, usize::min)
}

/// Share `capacity` among demands, smallest first: each gets its demand
/// or an equal part of what is left, whichever is less.
fn water_fill(capacity: f64, demands: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|a, b| demands[*a].total_cmp(&demands[*b]));
    let mut left = capacity.max(0.0);
    let mut out = vec![0.0; demands.len()];
    for (k, &i) in order.iter().enumerate() {
        let give = demands[i].max(0.0).min(left / (demands.len() - k) as f64);
        out[i] = give;
        left -= give;
    }
    out
}

/// Each member's part of `capacity` slots (members' demands, this instance
/// first): interactive demand first, then batch, the rest evenly. Sums to
/// `capacity`.
pub(crate) fn shares(capacity: f64, demands: &[Demand]) -> Vec<f64> {
    if demands.is_empty() {
        return Vec::new();
    }
    let interactive = water_fill(capacity, &demands.iter().map(|d| d.interactive as f64).collect::<Vec<_>>());
    let rest = capacity - interactive.iter().sum::<f64>();
    let batch = water_fill(rest, &demands.iter().map(|d| d.batch as f64).collect::<Vec<_>>());
    let slack = (rest - batch.iter().sum::<f64>()).max(0.0) / demands.len() as f64;
    interactive.iter().zip(&batch).map(|(i, b)| i + b + slack).collect()
}

/// This instance's part of each of a pool's replicas (`replicas`: URL and
/// local view; `own`: its demand; `id`: its fleet id), given its peers'
/// standings (their states' pool of this name). Each replica's free slots
/// are divided among the heard instances by [`shares`], rounded so that the
/// parts add up to the slots (largest remainders first; every instance
/// ranks the same way, by id, rotating over the replicas). Every instance's
/// interactive reservation counts `scale` of itself (see [`scaled`]).
pub(crate) fn split(id: &str, own: Demand, replicas: &[(&str, Local)], peers: &[Standing], pool: &str, scale: f64) -> Vec<Part> {
    let pool_of = |s: &State| s.pools.iter().find(|p| p.name == pool).cloned().map(|p| (s.id.clone(), p));
    let fresh: Vec<(String, PoolState)> = peers.iter().filter_map(|p| if let Standing::Fresh(s) = p { pool_of(s) } else { None }).collect();
    let lost: Vec<Option<PoolState>> = peers
        .iter()
        .filter_map(|p| if let Standing::Lost(s) = p { Some(s.as_deref().and_then(pool_of).map(|x| x.1)) } else { None })
        .collect();
    let unheard = peers.iter().any(|p| !matches!(p, Standing::Fresh(_)));
    let members = 1 + fresh.len() + lost.len();
    let on = |p: &PoolState, url: &str| p.replicas.iter().find(|r| r.url == url).cloned();
    // Per replica: the slots the heard instances share, and what others hold.
    let mut free = Vec::with_capacity(replicas.len());
    for (url, r) in replicas {
        if !r.healthy {
            free.push((0usize, 0usize, 0usize));
            continue;
        }
        let limit = fleet_limit(url, r.limit, fresh.iter().map(|(_, p)| p));
        let heard: usize = fresh.iter().filter_map(|(_, p)| on(p, url)).map(|x| x.inflight).sum();
        let equal = limit.div_ceil(members);
        let claimed: usize =
            lost.iter().map(|p| p.as_ref().and_then(|p| on(p, url)).map_or(equal, |x| x.slots.min(limit).max(x.inflight).max(equal))).sum();
        // What the replica runs beyond the instances heard from: lost and dead
        // instances' requests (and any other client's).
        let beyond = if unheard { r.scraped.map_or(0, |t| (t as usize).saturating_sub(r.inflight + heard)) } else { 0 };
        let reserve = claimed.max(beyond);
        free.push((limit.saturating_sub(reserve), heard + reserve, limit));
    }
    let capacity: usize = free.iter().map(|(f, _, _)| f).sum();
    let mut demands = vec![own];
    demands.extend(fresh.iter().map(|(_, p)| Demand {
        interactive: p.interactive,
        interactive_now: p.interactive_now,
        batch: p.batch,
        waiting: p.waiting,
    }));
    for d in &mut demands {
        d.interactive = scaled(d.interactive, d.interactive_now, scale);
    }
    let part = shares(capacity as f64, &demands);
    let n = demands.len();
    let fractions: Vec<f64> = if capacity == 0 { vec![1.0 / n as f64; n] } else { part.iter().map(|p| p / capacity as f64).collect() };
    // Members in id order (this instance is member 0).
    let mut by_id: Vec<(&str, usize)> = std::iter::once(id).chain(fresh.iter().map(|(i, _)| i.as_str())).zip(0..n).collect();
    by_id.sort();
    replicas
        .iter()
        .zip(free)
        .enumerate()
        .map(|(k, ((_, r), (f, others, limit)))| {
            if !r.healthy {
                return Part { slots: 0, others, limit };
            }
            let exact: Vec<f64> = fractions.iter().map(|x| f as f64 * x).collect();
            let floors: Vec<usize> = exact.iter().map(|e| (e + 1e-9).floor() as usize).collect();
            let left = f.saturating_sub(floors.iter().sum());
            // Rank members by remainder, then by id rotated by the replica's
            // position. The remainders are compared to a millionth: each
            // instance sums the shares in its own order (itself first), and
            // remainders alike but for their last bits must rank alike at
            // every instance, or the parts do not add up to the slots.
            let remainder = |m: usize| ((exact[m] - floors[m] as f64) * 1e6).round() as i64;
            let mut rank: Vec<(usize, usize)> = by_id.iter().enumerate().map(|(pos, &(_, m))| ((pos + n - k % n) % n, m)).collect();
            rank.sort_by_key(|&(pos, m)| (std::cmp::Reverse(remainder(m)), pos));
            let extra = rank.iter().take(left).any(|&(_, m)| m == 0);
            Part { slots: (floors[0] + extra as usize).max(1), others, limit }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;
    use crate::fleet::wire::ReplicaState;
    use std::time::Duration;

    #[test]
    fn the_fleets_reservation_is_parted_by_demand_and_adds_up() {
        let whole = Reserve { normal: 5, at_risk: 5, headroom: 1 };
        let ids = ["b", "a", "c"];
        let parts = |demands: [usize; 3]| -> Vec<Reserve> {
            (0..3)
                .map(|me| {
                    // Each instance lists itself first, the others as it heard them.
                    let mut w: Vec<(&str, usize)> = vec![(ids[me], demands[me])];
                    w.extend((0..3).filter(|&k| k != me).map(|k| (ids[k], demands[k])));
                    reserve_part(whole, &w)
                })
                .collect()
        };
        let idle = parts([0, 0, 0]);
        assert_eq!(idle.iter().map(|p| p.normal).sum::<usize>(), 5);
        assert_eq!(idle.iter().map(|p| p.headroom).collect::<Vec<_>>(), [0, 1, 0], "the one seat of headroom: the lowest id's");
        let busy = parts([6, 3, 1]);
        assert_eq!(busy.iter().map(|p| p.normal).collect::<Vec<_>>(), [3, 2, 0]);
        assert_eq!(busy.iter().map(|p| p.headroom).collect::<Vec<_>>(), [1, 0, 0], "the headroom goes where the demand is");
        assert_eq!(reserve_part(whole, &[("a", 4)]), whole, "alone in the fleet: all of it");
    }

    fn demand(interactive: usize, batch: usize) -> Demand {
        Demand { interactive, interactive_now: 0, batch, waiting: 0 }
    }

    fn local(limit: usize, inflight: usize, scraped: Option<u64>) -> Local {
        Local { healthy: true, inflight, limit, scraped }
    }

    /// A peer's state for pool `p`: per replica (URL, in-flight, limit, slots).
    fn peer(id: &str, d: Demand, replicas: &[(&str, usize, usize, usize)]) -> Arc<State> {
        Arc::new(State {
            id: id.into(),
            pools: vec![PoolState {
                name: "p".into(),
                interactive: d.interactive,
                interactive_now: d.interactive_now,
                batch: d.batch,
                batch_held: 0,
                waiting: d.waiting,
                interactive_waiting: 0,
                replicas: replicas
                    .iter()
                    .map(|&(url, inflight, limit, slots)| ReplicaState { url: url.into(), healthy: true, inflight, limit, slots })
                    .collect(),
                block: 256,
                sent: Vec::new(),
                owned: Vec::new(),
            }],
            sent_seq: 0,
            peers: Vec::new(),
            woken: false,
            news: 0,
        })
    }

    #[test]
    fn interactive_demand_is_met_first_then_batch_then_the_rest_evenly() {
        let s = shares(10.0, &[demand(2, 100), demand(6, 0), demand(0, 1)]);
        assert_eq!(s, vec![3.0, 6.0, 1.0], "interactive 2 and 6 first; batch 2 left: 1 each to the two that want it");
        let s = shares(12.0, &[demand(1, 1), demand(1, 1)]);
        assert_eq!(s, vec![6.0, 6.0], "demand met, the rest evenly");
        let s = shares(10.0, &[demand(8, 0), demand(8, 50)]);
        assert_eq!(s, vec![5.0, 5.0], "interactive over capacity is shared evenly, batch gets nothing");
        assert!((shares(7.0, &[demand(3, 9), demand(0, 2), demand(1, 0)]).iter().sum::<f64>() - 7.0).abs() < 1e-9);
    }

    #[test]
    fn every_instance_ranks_the_remainders_alike_so_the_parts_add_up() {
        // Three instances on 8 slots, each computing its own part with
        // itself first: their sums of the shares differ in the last bits,
        // and compared exactly, two remainders that are equal ranked apart
        // at one instance and not at another (parts 2, 2 and 3: a seat no
        // instance held).
        let demands = [("a", demand(3, 0)), ("b", demand(3, 14)), ("c", demand(5, 8))];
        let parts: Vec<usize> = demands
            .iter()
            .map(|&(me, d)| {
                let peers: Vec<Standing> =
                    demands.iter().filter(|(id, _)| *id != me).map(|&(id, d)| Standing::Fresh(peer(id, d, &[("r1", 0, 8, 1)]))).collect();
                split(me, d, &[("r1", local(8, 0, None))], &peers, "p", 1.0)[0].slots
            })
            .collect();
        assert_eq!(parts.iter().sum::<usize>(), 8, "the parts {parts:?} add up to the slots");
    }

    #[test]
    fn heard_peers_split_each_replica_by_demand_under_the_smallest_limit() {
        // The peer learned 12 for r1 (this instance 16): the fleet uses 12.
        let peers = [Standing::Fresh(peer("b", demand(4, 0), &[("r1", 3, 12, 6), ("r2", 1, 16, 6)]))];
        let parts = split("a", demand(0, 100), &[("r1", local(16, 9, None)), ("r2", local(16, 9, None))], &peers, "p", 1.0);
        // 28 slots: the peer's interactive 4 first, 24 to this instance's batch.
        assert_eq!(
            parts,
            vec![Part { slots: 10, others: 3, limit: 12 }, Part { slots: 14, others: 1, limit: 16 }],
            "24 slots in all, rounded by remainder"
        );
        // Alone with its peer idle: half each, at least one.
        let peers = [Standing::Fresh(peer("b", demand(0, 0), &[("r1", 0, 16, 8)]))];
        assert_eq!(
            split("a", demand(0, 0), &[("r1", local(16, 0, None))], &peers, "p", 1.0),
            vec![Part { slots: 8, others: 0, limit: 16 }]
        );
        let peers = [Standing::Fresh(peer("b", demand(0, 500), &[("r1", 16, 16, 16)]))];
        assert_eq!(split("a", demand(0, 0), &[("r1", local(16, 0, None))], &peers, "p", 1.0)[0].slots, 1, "never below one slot");
        // A peer serving other pools only changes nothing here but the member count.
        let parts = split("a", demand(0, 5), &[("r1", local(16, 0, None))], &[Standing::Fresh(peer("b", demand(0, 0), &[]))], "q", 1.0);
        assert_eq!(parts[0].slots, 16);
    }

    #[test]
    fn interactive_peaks_count_up_to_the_fleets_reservation_and_batch_gets_the_rest() {
        // Three instances on one replica of 9 slots, chat peaks of 4 at each
        // (12 together, past the slots), batch waiting only at "a"; the
        // fleet keeps 5 for chat, as one instance with the 9 slots would.
        let peers =
            [Standing::Fresh(peer("b", demand(4, 0), &[("r1", 1, 9, 3)])), Standing::Fresh(peer("c", demand(4, 0), &[("r1", 1, 9, 3)]))];
        let scale = interactive_scale(5, 12);
        let parts = split("a", demand(4, 8), &[("r1", local(9, 3, None))], &peers, "p", scale);
        // Each peak counts for 2 (4 x 5/12, rounded up): 6 for chat, 3 to a's batch.
        assert_eq!(parts[0].slots, 5, "a's chat 2 and the batch slots: {parts:?}");
        // Counted whole, the peaks take every slot and a's batch gets none of the others'.
        assert_eq!(split("a", demand(4, 8), &[("r1", local(9, 3, None))], &peers, "p", 1.0)[0].slots, 3);
        // What an instance holds and waits for now counts whatever its peak.
        let busy = [Standing::Fresh(peer("b", Demand { interactive: 4, interactive_now: 5, batch: 0, waiting: 0 }, &[("r1", 5, 9, 5)]))];
        let parts = split("a", demand(4, 8), &[("r1", local(9, 3, None))], &busy, "p", interactive_scale(5, 8));
        assert_eq!(parts[0].slots, 4, "b's 5 now first, a's 3 of chat and batch: {parts:?}");
        assert_eq!(interactive_scale(5, 0), 1.0, "no peaks: nothing to scale");
        assert_eq!(interactive_scale(9, 4), 1.0, "peaks under the reservation count whole");
    }

    #[test]
    fn the_parts_add_up_to_each_replicas_slots_and_remainders_rotate() {
        let urls = ["r1", "r2", "r3"];
        let replicas: Vec<(&str, Local)> = urls.iter().map(|u| (*u, local(16, 0, None))).collect();
        let state = |id: &str| peer(id, demand(0, 100), &[("r1", 0, 16, 5), ("r2", 0, 16, 5), ("r3", 0, 16, 5)]);
        let ids = ["a", "b", "c"];
        let parts: Vec<Vec<Part>> = ids
            .iter()
            .map(|me| {
                let peers: Vec<Standing> = ids.iter().filter(|i| *i != me).map(|i| Standing::Fresh(state(i))).collect();
                split(me, demand(0, 100), &replicas, &peers, "p", 1.0)
            })
            .collect();
        for k in 0..urls.len() {
            let sum: usize = parts.iter().map(|p| p[k].slots).sum();
            assert_eq!(sum, 16, "replica {k}: the three parts add up to its 16 slots: {parts:?}");
        }
        for (me, p) in ids.iter().zip(&parts) {
            let total: usize = p.iter().map(|x| x.slots).sum();
            assert_eq!(total, 16, "{me}: one extra slot each, on different replicas: {parts:?}");
        }
    }

    #[test]
    fn a_lost_peer_keeps_its_slots_and_a_gone_one_only_what_the_replica_still_runs() {
        // The replica runs 12, 2 of them this instance's: 10 beyond the instances heard.
        let r = [("r1", local(16, 2, Some(12)))];
        let quiet = [("r1", local(16, 2, Some(4)))];
        // Never heard: an equal share (8 of 16) is kept for it, or what the replica runs beyond.
        assert_eq!(split("a", demand(0, 100), &quiet, &[Standing::Lost(None)], "p", 1.0), vec![Part { slots: 8, others: 8, limit: 16 }]);
        assert_eq!(split("a", demand(0, 100), &r, &[Standing::Lost(None)], "p", 1.0), vec![Part { slots: 6, others: 10, limit: 16 }]);
        // Heard before holding 12 slots: those are kept, whatever the replica says.
        let last = peer("b", demand(0, 50), &[("r1", 11, 16, 12)]);
        assert_eq!(split("a", demand(0, 100), &quiet, &[Standing::Lost(Some(last))], "p", 1.0)[0].slots, 4);
        // It held one: at least an equal share is kept.
        let small = peer("b", demand(0, 1), &[("r1", 1, 16, 1)]);
        assert_eq!(split("a", demand(0, 100), &quiet, &[Standing::Lost(Some(small))], "p", 1.0)[0].slots, 8);
        // Gone: only what the replica still runs for others counts (10 of 16), then nothing.
        assert_eq!(split("a", demand(0, 100), &r, &[Standing::Gone], "p", 1.0)[0].slots, 6);
        let emptied = [("r1", local(16, 2, Some(2)))];
        assert_eq!(split("a", demand(0, 100), &emptied, &[Standing::Gone], "p", 1.0)[0].slots, 16);
        // Gone without a scrape: its share goes to the survivors.
        assert_eq!(split("a", demand(0, 100), &[("r1", local(16, 2, None))], &[Standing::Gone], "p", 1.0)[0].slots, 16);
        // An unhealthy replica gives no slots.
        let down = [("r1", Local { healthy: false, ..local(16, 0, None) })];
        assert_eq!(split("a", demand(0, 1), &down, &[], "p", 1.0)[0].slots, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_is_fresh_then_lost_then_gone_and_fresh_again_when_heard() {
        let config = FleetConfig { peer_timeout: Dur::secs(1), takeover_after: Dur::secs(3), ..FleetConfig::default() };
        let state = peer("b", demand(0, 0), &[]);
        let since = Instant::now();
        assert_eq!(standing(&config, since, None, since), Standing::Lost(None), "not heard yet: lost, not gone");
        assert_eq!(standing(&config, since, None, since + Duration::from_secs(3)), Standing::Gone);
        tokio::time::advance(Duration::from_secs(5)).await;
        let heard = Instant::now();
        let at = |secs: f64| heard + Duration::from_secs_f64(secs);
        assert_eq!(standing(&config, since, Some((heard, &state)), at(0.9)), Standing::Fresh(state.clone()));
        assert_eq!(standing(&config, since, Some((heard, &state)), at(1.0)), Standing::Lost(Some(state.clone())));
        assert_eq!(standing(&config, since, Some((heard, &state)), at(2.9)), Standing::Lost(Some(state.clone())));
        assert_eq!(standing(&config, since, Some((heard, &state)), at(3.0)), Standing::Gone);
        // It answers again.
        assert_eq!(standing(&config, since, Some((at(10.0), &state)), at(10.1)), Standing::Fresh(state));
    }
}
