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
