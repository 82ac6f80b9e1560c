//! Prometheus text the reports read: a scrape's samples, what a counter or
//! a histogram gained between two scrapes, and `histogram_quantile`'s
//! reading of buckets.

use std::collections::BTreeMap;
use std::path::Path;

/// A series: its name and its labels, sorted.
pub type Series = (String, Vec<(String, String)>);

/// The samples of a scrape saved at a path (series with labels only).
pub type Samples = BTreeMap<Series, f64>;

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_' || c == ':')
}

/// The `key="value"` pairs of a label set.
fn labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(eq) = rest.find("=\"") {
        let key: String = rest[..eq].chars().rev().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let key: String = key.chars().rev().collect();
        let after = &rest[eq + 2..];
        let Some(end) = after.find('"') else { break };
        if !key.is_empty() {
            out.push((key, after[..end].to_string()));
        }
        rest = &after[end + 1..];
    }
    out.sort();
    out
}

/// One line `name{labels} value`, if it is one.
fn sample(line: &str) -> Option<(Series, f64)> {
    let line = line.trim();
    let (name, rest) = line.split_once('{')?;
    let (inside, value) = rest.split_once("} ")?;
    if !is_name(name) || inside.contains('}') || value.is_empty() || value.contains(char::is_whitespace) {
        return None;
    }
    Some(((name.to_string(), labels(inside)), value.parse().ok()?))
}

/// The samples of a scrape saved at `path`.
pub fn samples(path: &Path) -> Result<Samples, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text.lines().filter_map(sample).collect())
}

/// A label's value in a series' sorted labels.
pub fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// What the series `name` whose labels `want` gained, summed.
pub fn delta_of(before: &Samples, after: &Samples, name: &str, want: impl Fn(&[(String, String)]) -> bool) -> f64 {
    after.iter().filter(|((n, l), _)| n == name && want(l)).map(|(k, v)| v - before.get(k).copied().unwrap_or(0.0)).fold(0.0, |a, b| a + b)
}

/// (upper bound, cumulative count) of `name`'s buckets gained, summed
/// over the series whose labels `want`, by bound.
pub fn buckets(before: &Samples, after: &Samples, name: &str, want: impl Fn(&[(String, String)]) -> bool) -> Vec<(f64, f64)> {
    let mut by_le: Vec<(f64, f64)> = Vec::new();
    for (k, v) in after.iter().filter(|((n, l), _)| n == name && want(l)) {
        let Some(le) = label(&k.1, "le") else { continue };
        let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
        let gained = v - before.get(k).copied().unwrap_or(0.0);
        match by_le.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += gained,
            None => by_le.push((le, gained)),
        }
    }
    by_le.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    by_le
}

/// `histogram_quantile`'s linear interpolation inside the bucket.
pub fn quantile(q: f64, bs: &[(f64, f64)]) -> f64 {
    let Some(&(_, total)) = bs.last() else { return f64::NAN };
    let (rank, mut lo, mut below) = (q * total, 0.0, 0.0);
    for &(le, c) in bs {
        if c >= rank {
            if le.is_infinite() {
                return lo;
            }
            return lo + (le - lo) * ((rank - below) / (c - below).max(1e-12));
        }
        (lo, below) = (le, c);
    }
    lo
}

/// The (lower, upper] bounds of the bucket `v` falls in.
pub fn bucket_of(v: f64, bs: &[(f64, f64)]) -> (f64, f64) {
    let mut lo = 0.0;
    for &(le, _) in bs {
        if v <= le {
            return (lo, le);
        }
        lo = le;
    }
    (lo, f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(text: &str) -> Samples {
        text.lines().filter_map(sample).collect()
    }

    /// Series with labels are read, sorted by key; others are not.
    #[test]
    fn a_scrape_reads_its_labelled_series() {
        let s = scrape("# HELP x\nx_total{b=\"2\",a=\"1\"} 3\nplain 4\nh_bucket{le=\"+Inf\"} 7\nbad{a=\"1\"} 1 2\n");
        let key = ("x_total".to_string(), vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert_eq!(s.get(&key), Some(&3.0));
        assert_eq!(s.len(), 2, "{s:?}");
    }

    /// Gains between two scrapes, and the quantile inside the bucket it
    /// falls in, as Prometheus reads it.
    #[test]
    fn buckets_gained_give_the_quantile_prometheus_would() {
        let before = scrape("h_bucket{le=\"0.1\"} 10\nh_bucket{le=\"0.2\"} 10\nh_bucket{le=\"+Inf\"} 10\nc{x=\"a\"} 5\n");
        let after = scrape("h_bucket{le=\"0.1\"} 60\nh_bucket{le=\"0.2\"} 110\nh_bucket{le=\"+Inf\"} 110\nc{x=\"a\"} 8\nc{x=\"b\"} 1\n");
        let bs = buckets(&before, &after, "h_bucket", |_| true);
        assert_eq!(bs, vec![(0.1, 50.0), (0.2, 100.0), (f64::INFINITY, 100.0)]);
        assert!((quantile(0.5, &bs) - 0.1).abs() < 1e-12);
        assert!((quantile(0.75, &bs) - 0.15).abs() < 1e-12);
        assert_eq!(bucket_of(0.15, &bs), (0.1, 0.2));
        assert_eq!(delta_of(&before, &after, "c", |l| label(l, "x") == Some("a")), 3.0);
        assert_eq!(delta_of(&before, &after, "c", |_| true), 4.0);
    }
}
