//! Charts of a run, as SVG and PNG: TTFT CDF per class, TTFT p99 over time
//! with each class's SLO line, and completed and rejected requests per second.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::run::RunResult;

/// Fonts tried, in order, for chart text.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn ensure_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = FONTS
            .iter()
            .find(|p| Path::new(p).is_file())
            .ok_or_else(|| format!("no TTF font found for chart text (install fonts-dejavu-core); looked in {FONTS:?}"))?;
        let bytes: &'static [u8] = Box::leak(std::fs::read(path).map_err(|e| format!("{path}: {e}"))?.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| format!("{path}: not a usable font"))
    })
    .clone()
}

struct Chart {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<(String, Vec<(f64, f64)>)>,
    /// Horizontal reference lines (label, y).
    lines: Vec<(String, f64)>,
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| format!("{x:?}");
    root.fill(&WHITE).map_err(e)?;
    let pts = c.series.iter().flat_map(|(_, p)| p.iter());
    let x_max = pts.clone().map(|p| p.0).fold(0.0, f64::max).max(1e-9);
    let y_max = pts.map(|p| p.1).chain(c.lines.iter().map(|l| l.1)).fold(0.0, f64::max).max(1e-9) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(e)?;
    chart.configure_mesh().x_desc(c.x_label.as_str()).y_desc(c.y_label.as_str()).label_style(("sans-serif", 14)).draw().map_err(e)?;
    for (i, (name, points)) in c.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(e)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    for (i, (name, y)) in c.lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new([(0.0, *y), (x_max, *y)], color.stroke_width(1)))
            .map_err(e)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

fn both(c: &Chart, dir: &Path, stem: &str, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let svg = dir.join(format!("{stem}.svg"));
    draw(SVGBackend::new(&svg, (960, 540)).into_drawing_area(), c)?;
    out.push(svg);
    Ok(())
}

fn window_p99(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 * 0.99).ceil() as usize).saturating_sub(1).min(values.len() - 1)]
}

/// Records by class.
type ByClass<'a> = BTreeMap<&'a str, Vec<&'a super::Record>>;

/// Render the charts of `r` into `dir` as `PREFIX-*.svg`; returns the files.
pub fn render(r: &RunResult, dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut by_class: ByClass = BTreeMap::new();
    for x in &r.records {
        by_class.entry(x.class.as_str()).or_default().push(x);
    }
    let mut out = Vec::new();
    for (name, chart) in [("ttft-cdf", ttft_cdf(r, &by_class)), ("ttft-p99", ttft_p99(r, &by_class)), ("throughput", throughput(r))] {
        both(&chart, dir, &format!("{prefix}-{name}"), &mut out)?;
    }
    Ok(out)
}

/// TTFT CDF per class.
fn ttft_cdf(r: &RunResult, by_class: &ByClass) -> Chart {
    let mut series = Vec::new();
    for (class, recs) in by_class {
        let mut t: Vec<f64> = recs.iter().filter_map(|x| x.ttft_ms).collect();
        if t.is_empty() {
            continue;
        }
        t.sort_by(f64::total_cmp);
        let n = t.len() as f64;
        series.push((class.to_string(), t.iter().enumerate().map(|(i, v)| (*v, (i + 1) as f64 / n)).collect()));
    }
    Chart {
        title: format!("{}: TTFT CDF per class", r.label),
        x_label: "TTFT (ms)".into(),
        y_label: "share of requests".into(),
        series,
        lines: vec![],
    }
}

/// TTFT p99 over time, 5 s windows, with each class's target.
fn ttft_p99(r: &RunResult, by_class: &ByClass) -> Chart {
    let window = 5.0;
    let mut series = Vec::new();
    let mut lines = Vec::new();
    for (class, recs) in by_class {
        let mut buckets: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for x in recs {
            if let Some(t) = x.ttft_ms {
                buckets.entry((x.start_s / window) as u64).or_default().push(t);
            }
        }
        let pts: Vec<(f64, f64)> = buckets.iter_mut().map(|(w, v)| ((*w as f64 + 1.0) * window, window_p99(v))).collect();
        if !pts.is_empty() {
            series.push((format!("{class} p99"), pts));
            if let Some(t) = r.scenario.classes.get(*class) {
                lines.push((format!("{class} SLO {} ms", t.ttft_ms), t.ttft_ms));
            }
        }
    }
    Chart {
        title: format!("{}: TTFT p99 over time ({window} s windows)", r.label),
        x_label: "time (s)".into(),
        y_label: "TTFT p99 (ms)".into(),
        series,
        lines,
    }
}

/// Completed, rejected and failed requests per second.
fn throughput(r: &RunResult) -> Chart {
    let secs = r.elapsed_s.ceil().max(1.0) as usize;
    let mut done = vec![0.0; secs + 1];
    let mut rejected = vec![0.0; secs + 1];
    let mut failed = vec![0.0; secs + 1];
    for x in &r.records {
        let end = ((x.start_s + x.e2e_ms / 1000.0) as usize).min(secs);
        if x.completed() {
            done[end] += 1.0;
        } else if x.outcome == "rejected" {
            rejected[end] += 1.0;
        } else {
            failed[end] += 1.0;
        }
    }
    let pts = |v: &[f64]| v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect::<Vec<_>>();
    let series = vec![
        ("completed/s".to_string(), pts(&done)),
        ("rejected (429)/s".to_string(), pts(&rejected)),
        ("failed/s".to_string(), pts(&failed)),
    ];
    Chart {
        title: format!("{}: throughput and rejections", r.label),
        x_label: "time (s)".into(),
        y_label: "requests per second".into(),
        series,
        lines: vec![],
    }
}

/// Chart the columns of a CSV file (a header row, then numbers; the first
/// column is the x axis) as one line each, with optional horizontal lines.
/// Writes `DIR/STEM.svg`.
pub fn render_csv(
    csv: &Path,
    dir: &Path,
    stem: &str,
    title: &str,
    y_label: &str,
    lines: Vec<(String, f64)>,
) -> Result<Vec<PathBuf>, String> {
    ensure_font()?;
    let text = std::fs::read_to_string(csv).map_err(|e| format!("{}: {e}", csv.display()))?;
    let mut rows = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> =
        rows.next().ok_or_else(|| format!("{}: empty", csv.display()))?.split(',').map(|h| h.trim().to_string()).collect();
    if header.len() < 2 {
        return Err(format!("{}: need an x column and at least one series", csv.display()));
    }
    let mut series: Vec<(String, Vec<(f64, f64)>)> = header[1..].iter().map(|h| (h.clone(), Vec::new())).collect();
    for (n, row) in rows.enumerate() {
        let vals: Vec<f64> = row
            .split(',')
            .map(|v| v.trim().parse::<f64>().map_err(|e| format!("{}: row {}: {e}", csv.display(), n + 2)))
            .collect::<Result<_, _>>()?;
        for (i, s) in series.iter_mut().enumerate() {
            if let Some(y) = vals.get(i + 1) {
                s.1.push((vals[0], *y));
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    let chart = Chart { title: title.into(), x_label: header[0].clone(), y_label: y_label.into(), series, lines };
    both(&chart, dir, stem, &mut out)?;
    Ok(out)
}
