//! What a report writes: `measured.json` (the values a scenario's checks
//! judge, each with how the report states it), numbers as the reports
//! print them, the timelines a driver sampled, and charts.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

/// The values of one run for `measured.json`: a number, a yes/no, nothing
/// (not measured), each optionally with the words the result shows.
#[derive(Default)]
pub struct Measured(BTreeMap<String, Value>);

fn number(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

impl Measured {
    /// A number and how the report states it; NaN or infinite: not measured.
    pub fn stated(&mut self, key: &str, value: f64, text: impl Into<String>) {
        self.0.insert(key.into(), json!({ "value": number(value), "text": text.into() }));
    }

    /// A number that may be missing, and how the report states it.
    pub fn maybe(&mut self, key: &str, value: Option<f64>, text: impl Into<String>) {
        self.stated(key, value.unwrap_or(f64::NAN), text);
    }

    /// A yes/no and how the report states it.
    pub fn flag(&mut self, key: &str, value: bool, text: impl Into<String>) {
        self.0.insert(key.into(), json!({ "value": value, "text": text.into() }));
    }

    /// A yes/no that may be missing (not judged), and how the report states it.
    pub fn maybe_flag(&mut self, key: &str, value: Option<bool>, text: impl Into<String>) {
        self.0.insert(key.into(), json!({ "value": value, "text": text.into() }));
    }

    /// A bare yes/no.
    pub fn plain_flag(&mut self, key: &str, value: bool) {
        self.0.insert(key.into(), json!(value));
    }

    /// A bare number.
    pub fn plain(&mut self, key: &str, value: f64) {
        self.0.insert(key.into(), number(value));
    }

    /// Writes `DIR/measured.json`.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(&self.0).map_err(|e| e.to_string())?;
        write(&dir.join("measured.json"), &text)
    }
}

/// A file's text, saying which on failure.
pub fn read_text(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A JSON file read as `T`, saying which on failure.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    serde_json::from_str(&read_text(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes a file, saying which on failure.
pub fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `v` with `prec` decimals, `nan` and `inf` spelled as the reports
/// always have.
pub fn n(v: f64, prec: usize) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        (if v > 0.0 { "inf" } else { "-inf" }).into()
    } else {
        format!("{v:.prec$}")
    }
}

/// As [`n`], with its sign always shown.
pub fn signed(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:+.prec$}")
    } else {
        n(v, prec)
    }
}

/// A share as a percentage with `prec` decimals.
pub fn percent(share: f64, prec: usize) -> String {
    n(100.0 * share, prec)
}

/// A number as Python's `{:g}` writes it: six significant digits, no
/// trailing zeros (bucket bounds in milliseconds).
pub fn g(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return if v.is_nan() {
            "nan".into()
        } else if v == 0.0 {
            "0".into()
        } else {
            n(v, 0)
        };
    }
    let decimals = (5 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// `v` with no decimals and a comma between thousands, as Python's `,.0f`.
pub fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return n(v, 0);
    }
    let s = n(v.abs(), 0);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 && s != "0" {
        out.insert(0, '-');
    }
    out
}
/// A JSON value as Python's `str()` prints it (what the Python reports
/// wrote): `None`, `True`, `404`, `1.5`, a string as is.
pub fn py_str(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => (if *b { "True" } else { "False" }).into(),
        Value::Number(x) if x.is_f64() => {
            let f = x.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 1e16 {
                format!("{f:.1}")
            } else {
                f.to_string()
            }
        }
        Value::Number(x) => x.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => {
            format!("{{{}}}", o.iter().map(|(k, v)| format!("{}: {}", quoted(k), py_repr(v))).collect::<Vec<_>>().join(", "))
        }
    }
}

/// A JSON value as Python's `repr()` prints it: a string quoted, the rest
/// as [`py_str`].
pub fn py_repr(v: &Value) -> String {
    match v {
        Value::String(s) => quoted(s),
        v => py_str(v),
    }
}

/// A string as Python quotes it: in single quotes unless it holds one and
/// no double quote, with backslashes and control characters escaped.
fn quoted(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// A CSV a driver wrote (a header, then numbers): rows by column name.
pub struct Table {
    columns: BTreeMap<String, usize>,
    pub rows: Vec<Vec<f64>>,
    /// The cells as written.
    cells: Vec<Vec<String>>,
}

impl Table {
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header = lines.next().ok_or_else(|| format!("{}: empty", path.display()))?;
        let columns = header.split(',').enumerate().map(|(i, c)| (c.trim().to_string(), i)).collect();
        let cells: Vec<Vec<String>> = lines.map(|l| l.split(',').map(|v| v.trim().to_string()).collect()).collect();
        let rows = cells.iter().map(|r| r.iter().map(|v| v.parse::<f64>().unwrap_or(f64::NAN)).collect()).collect();
        Ok(Self { columns, rows, cells })
    }

    /// Column `name` of row `i` as written; empty where either is missing.
    pub fn text(&self, i: usize, name: &str) -> &str {
        self.columns.get(name).and_then(|&c| self.cells.get(i)?.get(c)).map_or("", String::as_str)
    }

    /// Column `name` of row `i`; NaN where either is missing.
    pub fn at(&self, i: usize, name: &str) -> f64 {
        self.columns.get(name).and_then(|&c| self.rows.get(i)?.get(c).copied()).unwrap_or(f64::NAN)
    }

    /// Column `name`, every row.
    pub fn column(&self, name: &str) -> Vec<f64> {
        (0..self.rows.len()).map(|i| self.at(i, name)).collect()
    }
}

/// Charts the CSV at `csv` (an x column, then one series a column) as
/// `DIR/STEM.svg`, with horizontal lines `(label, y)`.
#[cfg(feature = "plots")]
pub fn chart(csv: &Path, dir: &Path, stem: &str, title: &str, y_label: &str, lines: &[(&str, f64)]) -> Result<(), String> {
    let lines = lines.iter().map(|(l, y)| (l.to_string(), *y)).collect();
    crate::loadgen::plots::render_csv(csv, dir, stem, title, y_label, lines).map(|_| ())
}

/// Without the `plots` feature there are no charts.
#[cfg(not(feature = "plots"))]
pub fn chart(_: &Path, _: &Path, _: &str, _: &str, _: &str, _: &[(&str, f64)]) -> Result<(), String> {
    Ok(())
}

/// The sum of a Prometheus counter's samples in a scrape; 0 without the file.
pub fn counter(path: &Path, name: &str) -> f64 {
    let Ok(text) = std::fs::read_to_string(path) else { return 0.0 };
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b) // from +0: an empty sum prints 0, not -0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_the_reports_print_them() {
        assert_eq!(n(f64::NAN, 0), "nan");
        assert_eq!(n(2.5, 0), "2");
        assert_eq!(n(1.23456, 2), "1.23");
        assert_eq!(signed(1.5, 1), "+1.5");
        assert_eq!(signed(-0.25, 2), "-0.25");
        assert_eq!(percent(0.98765, 2), "98.77");
    }

    #[test]
    fn measured_values_are_written_as_the_runner_reads_them() {
        let dir = tempfile::tempdir().expect("a folder");
        let mut m = Measured::default();
        m.stated("p99", 120.0, "120 ms");
        m.stated("none", f64::NAN, "no data");
        m.flag("ok", true, "yes");
        m.plain("n", 3.0);
        m.write(dir.path()).expect("written");
        let read: BTreeMap<String, crate::bench::Measured> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("measured.json")).expect("read")).expect("parsed");
        use crate::bench::judge::Value as V;
        assert_eq!(read["p99"], crate::bench::Measured::Stated { value: Some(V::Number(120.0)), text: Some("120 ms".into()) });
        assert_eq!(read["none"], crate::bench::Measured::Stated { value: None, text: Some("no data".into()) });
        assert_eq!(read["n"], crate::bench::Measured::Number(3.0));
    }

    #[test]
    fn a_counter_is_summed_over_its_series_and_no_other() {
        let dir = tempfile::tempdir().expect("a folder");
        let p = dir.path().join("m.prom");
        std::fs::write(&p, "# HELP x\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3.5\nx_total_more 9\nx_total 1\n").expect("write");
        assert_eq!(counter(&p, "x_total"), 6.5);
        assert_eq!(counter(&dir.path().join("none"), "x_total"), 0.0);
    }

    #[test]
    fn bounds_read_as_python_writes_them() {
        assert_eq!(g(5.0), "5");
        assert_eq!(g(0.025 * 1000.0), "25");
        assert_eq!(g(2.5), "2.5");
        assert_eq!(g(f64::INFINITY), "inf");
        assert_eq!(g(0.0), "0");
        assert_eq!(g(1234.5678), "1234.57");
    }

    #[test]
    fn thousands_and_python_values_print_as_python_printed_them() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(thousands(-1234.0), "-1,234");
        assert_eq!(py_repr(&json!("it's")), "\"it's\"");
        assert_eq!(py_repr(&json!("a\nb")), "'a\\nb'");
        assert_eq!(py_repr(&Value::Null), "None");
        assert_eq!(py_str(&json!(404)), "404");
        assert_eq!(py_str(&json!(1.0)), "1.0");
        assert_eq!(py_str(&json!(["a", "b"])), "['a', 'b']");
    }
}
