"""Quantiles the benchmark reports share (imported from the scripts beside it)."""


def pct(values, q):
    """The q-quantile of a list of values (nearest rank); NaN when empty."""
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def pct_pairs(pairs, q):
    """The q-quantile of (value, count) pairs, as loadgen writes gaps; NaN when empty."""
    total = sum(c for _, c in pairs)
    seen = 0
    for v, c in sorted(pairs):
        seen += c
        if seen >= q * total:
            return v
    return float("nan")


def interleaved(run, target, warm=5.0):
    """One path of a loadgen run whose requests took its targets in turn,
    from a simulator that stamps its chunks: TTFT p50, the path's share of
    TTFT (client TTFT minus the engine's) at p50, the client's ITL p99 and
    how far it lies above the replica's ITL p99 of the same gaps (ms)."""
    recs = [x for x in run["records"] if x["start_s"] >= warm and x.get("target") == target]
    ok = [x for x in recs if x["outcome"] in ("ok", "length") and x["ttft_ms"] is not None]
    gaps = run.get("itl_by_target", {})
    client = pct_pairs(gaps.get("client_us", {}).get(str(target), []), 0.99) / 1000
    engine = pct_pairs(gaps.get("engine_us", {}).get(str(target), []), 0.99) / 1000
    return {"n": len(recs), "bad": len(recs) - len(ok), "ttft50": pct([x["ttft_ms"] for x in ok], 0.5),
            "path50": pct([x["ttft_ms"] - x["engine_ttft_ms"] for x in ok if x.get("engine_ttft_ms") is not None], 0.5),
            "itl99": client, "shift99": client - engine}
