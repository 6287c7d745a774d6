//! `--plot FILE.svg`: admitted and rejected requests over time, one panel per policy.
//!
//! Why: a table says how many were rejected; a plot says *when* — the fixed window's burst at
//! the boundary, the window limiters' rejections under Poisson clumps. Time is cut into equal
//! buckets (about one per two arrivals, between 10 and 100 of them; a 1-2-5 width aligned to
//! multiples of itself, so second boundaries fall on bucket edges) and each panel draws the
//! admitted and rejected counts per bucket, all panels on the same scale.
//!
//! How: plotters draws each panel with its SVG backend into a string, and this module stacks
//! the panels in one document, each inside `<g class="policy" data-policy="NAME">` with a
//! `<title>`, so the file is one valid SVG with one group per policy that tools and tests can
//! find. Text needs no font files: plotters is built without `ttf`/`ab_glyph`, so it only
//! estimates text sizes and the SVG backend writes `<text>` elements for the viewer to render.

use super::report::Report;
use super::run::PolicyResult;
use super::SimError;
use crate::limiter::{Nanos, SECOND};
use plotters::prelude::*;
use std::path::Path;

const WIDTH: u32 = 960;
const PANEL_HEIGHT: u32 = 240;
const MIN_BUCKETS: u64 = 10;
const MAX_BUCKETS: u64 = 100;
const ADMITTED: RGBColor = RGBColor(0x1b, 0x9e, 0x77);
const REJECTED: RGBColor = RGBColor(0xd9, 0x5f, 0x02);

/// Writes the report's plot to `path`.
pub fn write_svg(report: &Report, path: &Path) -> Result<(), SimError> {
    let fail = |message: String| SimError::Plot {
        path: path.display().to_string(),
        message,
    };
    let svg = render(report).map_err(fail)?;
    std::fs::write(path, svg).map_err(|e| fail(e.to_string()))
}

/// The plot as one SVG document.
pub fn render(report: &Report) -> Result<String, String> {
    let buckets = Buckets::covering(report);
    let peak = report
        .results
        .iter()
        .flat_map(|r| [&r.admitted_at, &r.rejected_at])
        .flat_map(|times| buckets.counts(times))
        .map(|(_, count)| count)
        .max()
        .unwrap_or(0);
    // Headroom above the peak for the legend.
    let y_max = peak + peak / 3 + 2;
    let header = 36 + 16 * report.notes.len() as u32;
    let height = header + PANEL_HEIGHT * report.results.len() as u32;
    let mut doc = format!(
        "<svg width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <title>{title}: admitted and rejected requests over time</title>\n\
         <rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{height}\" fill=\"white\"/>\n\
         <text x=\"{mid}\" y=\"24\" text-anchor=\"middle\" font-family=\"sans-serif\" font-size=\"18\">{title}: admitted and rejected requests over time</text>\n",
        title = escape(&report.title),
        mid = WIDTH / 2,
    );
    for (i, note) in report.notes.iter().enumerate() {
        doc.push_str(&format!(
            "<text x=\"12\" y=\"{}\" font-family=\"sans-serif\" font-size=\"12\">{}</text>\n",
            44 + 16 * i,
            escape(note)
        ));
    }
    for (i, r) in report.results.iter().enumerate() {
        let name = escape(&r.name);
        doc.push_str(&format!(
            "<g class=\"policy\" data-policy=\"{name}\" transform=\"translate(0,{})\">\n<title>{name} ({}, {}): {} allowed, {} rejected</title>\n",
            header + PANEL_HEIGHT * i as u32,
            r.algorithm,
            escape(&r.limit),
            r.allowed,
            r.rejected,
        ));
        doc.push_str(&panel(r, &buckets, y_max)?);
        doc.push_str("</g>\n");
    }
    doc.push_str("</svg>\n");
    Ok(doc)
}

/// Equal time buckets covering every arrival of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Buckets {
    start: Nanos,
    width: Nanos,
    count: u64,
}

impl Buckets {
    fn covering(report: &Report) -> Self {
        let times = report
            .results
            .iter()
            .flat_map(|r| [&r.admitted_at, &r.rejected_at])
            .flat_map(|v| v.first().into_iter().chain(v.last()));
        let (lo, hi) = times.fold((Nanos::MAX, 0), |(lo, hi), &t| (lo.min(t), hi.max(t)));
        let (lo, hi) = if lo > hi { (0, SECOND) } else { (lo, hi) };
        let arrivals = report
            .results
            .first()
            .map_or(0, |r| r.admitted_at.len() + r.rejected_at.len()) as u64;
        let target = (arrivals / 2).clamp(MIN_BUCKETS, MAX_BUCKETS);
        // At least 1 ms shown, so a single instant still gets a readable axis.
        let width = nice_width((hi - lo).max(1_000_000).div_ceil(target));
        let start = lo / width * width;
        Buckets {
            start,
            width,
            count: (hi - start) / width + 1,
        }
    }

    /// Counts per bucket, as (bucket centre in seconds, count).
    fn counts(&self, times: &[Nanos]) -> Vec<(f64, u64)> {
        let mut counts = vec![0u64; self.count as usize];
        for &t in times {
            let i = ((t.saturating_sub(self.start)) / self.width).min(self.count - 1);
            counts[i as usize] += 1;
        }
        counts
            .into_iter()
            .enumerate()
            .map(|(i, c)| (self.secs(i as u64) + self.width as f64 / 2e9, c))
            .collect()
    }

    /// The start of bucket `i`, in seconds.
    fn secs(&self, i: u64) -> f64 {
        (self.start as f64 + i as f64 * self.width as f64) / 1e9
    }
}

/// The smallest of 1, 2, 5 x 10^k nanoseconds that is at least `raw`.
fn nice_width(raw: Nanos) -> Nanos {
    let mut unit: Nanos = 1;
    loop {
        for m in [1, 2, 5] {
            match unit.checked_mul(m) {
                Some(w) if w >= raw => return w,
                None => return Nanos::MAX,
                _ => {}
            }
        }
        match unit.checked_mul(10) {
            Some(u) => unit = u,
            None => return Nanos::MAX,
        }
    }
}

/// `20 µs`, `0.5 s`: a bucket width for an axis label.
fn duration_label(ns: Nanos) -> String {
    let (value, unit) = match ns {
        n if n >= SECOND => (n as f64 / 1e9, "s"),
        n if n >= 1_000_000 => (n as f64 / 1e6, "ms"),
        n if n >= 1_000 => (n as f64 / 1e3, "µs"),
        n => (n as f64, "ns"),
    };
    format!("{value} {unit}")
}

fn panel(r: &PolicyResult, b: &Buckets, y_max: u64) -> Result<String, String> {
    let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
    let admitted = b.counts(&r.admitted_at);
    let rejected = b.counts(&r.rejected_at);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, PANEL_HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let caption = format!(
            "{} ({}, {}): {} allowed, {} rejected, max {} per window",
            r.name, r.algorithm, r.limit, r.allowed, r.rejected, r.max_in_window
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(52)
            .build_cartesian_2d(b.secs(0)..b.secs(b.count), 0u64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc(format!("per {}", duration_label(b.width)))
            .x_labels(10)
            .y_labels(5)
            .draw()
            .map_err(err)?;
        for (points, color, label) in [
            (&admitted, ADMITTED, "admitted"),
            (&rejected, REJECTED, "rejected"),
        ] {
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart
                .draw_series(
                    points
                        .iter()
                        .filter(|p| p.1 > 0)
                        .map(|&p| Circle::new(p, 2, color.filled())),
                )
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Escapes text for SVG content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_widths_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_width(0), 1);
        assert_eq!(nice_width(3), 5);
        assert_eq!(nice_width(600_000_000), 1_000_000_000);
        assert_eq!(nice_width(19_000), 20_000);
        assert_eq!(nice_width(u64::MAX), u64::MAX);
    }

    #[test]
    fn the_boundary_plot_has_one_group_per_policy() {
        let svg = render(&crate::sim::boundary()).unwrap();
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<g class=\"policy\"").count(), 5);
        assert!(svg.contains("data-policy=\"fixed_window\""));
        assert!(svg.contains("time (s)"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn every_arrival_lands_in_a_bucket() {
        let report = crate::sim::boundary();
        let b = Buckets::covering(&report);
        let total: u64 = b
            .counts(&report.results[0].admitted_at)
            .iter()
            .map(|p| p.1)
            .sum();
        assert_eq!(total, 20);
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
