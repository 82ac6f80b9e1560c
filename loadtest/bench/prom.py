"""Prometheus text the benchmark reports read (imported from the scripts
beside it): a scrape's samples, what a counter or histogram gained between
two scrapes, and histogram_quantile's reading of buckets."""
import re

SERIES = re.compile(r'^([\w:]+)\{([^}]*)\} (\S+)$')


def samples(path):
    """{(name, sorted label pairs): value} of a scrape saved at `path`."""
    out = {}
    for line in open(path):
        m = SERIES.match(line.strip())
        if m:
            labels = dict(kv.split("=", 1) for kv in re.findall(r'\w+="[^"]*"', m.group(2)))
            labels = {k: v.strip('"') for k, v in labels.items()}
            out[(m.group(1), tuple(sorted(labels.items())))] = float(m.group(3))
    return out


def delta_of(before, after, name, want=lambda l: True):
    """What the series `name` whose labels `want` gained, summed."""
    total = 0.0
    for (n, labels), v in after.items():
        if n == name and want(dict(labels)):
            total += v - before.get((n, labels), 0.0)
    return total


def buckets(before, after, name, want=lambda l: True):
    """(upper bound, cumulative count) of `name`'s buckets gained, summed over series."""
    by_le = {}
    for (n, labels), v in after.items():
        if n == name and want(dict(labels)):
            le = dict(labels)["le"]
            by_le[le] = by_le.get(le, 0.0) + v - before.get((n, labels), 0.0)
    return sorted(((float("inf") if le == "+Inf" else float(le), c) for le, c in by_le.items()))


def quantile(q, bs):
    """histogram_quantile's linear interpolation inside the bucket."""
    total = bs[-1][1]
    rank, lo, below = q * total, 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * ((rank - below) / max(c - below, 1e-12))
        lo, below = le, c
    return lo


def bucket_of(v, bs):
    """The (lower, upper] bounds of the bucket `v` falls in."""
    lo = 0.0
    for le, _ in bs:
        if v <= le:
            return (lo, le)
        lo = le
    return (lo, float("inf"))
