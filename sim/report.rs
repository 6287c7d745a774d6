//! Presenting simulation results: an aligned text table for people, JSON for scripts.
//!
//! Why separate from running: the same [`Report`] feeds the table, the JSON and the plot,
//! so the three can never disagree. The JSON shape is a contract
//! (`{"results":[{"policy","algorithm","allowed","rejected", ...}]}`); fields after those
//! four may be added, never removed or reordered.

use super::run::PolicyResult;
use crate::limiter::{Nanos, SECOND};
use serde::Serialize;

/// The results of one scenario, with the lines that say what the scenario was.
#[derive(Debug, Clone)]
pub struct Report {
    /// The command, e.g. `quorate sim boundary`.
    pub title: String,
    /// What was simulated: arrivals, policies, deliberate choices.
    pub notes: Vec<String>,
    pub results: Vec<PolicyResult>,
}

/// Nanoseconds as exact decimal seconds, without trailing zeros: `1.5`, `0.9999`, `60`.
pub fn seconds(ns: Nanos) -> String {
    let (s, frac) = (ns / SECOND, ns % SECOND);
    if frac == 0 {
        return s.to_string();
    }
    let digits = format!("{frac:09}");
    format!("{s}.{}", digits.trim_end_matches('0'))
}

#[derive(Serialize)]
struct Json<'a> {
    results: Vec<JsonRow<'a>>,
}

#[derive(Serialize)]
struct JsonRow<'a> {
    policy: &'a str,
    algorithm: &'static str,
    allowed: u64,
    rejected: u64,
    /// Percent of arrivals allowed, to two decimals; null with no arrivals.
    allow_rate: Option<f64>,
    max_in_window: u64,
    window_ns: Nanos,
    limit: &'a str,
}

impl Report {
    /// `{"results":[{"policy":..,"algorithm":..,"allowed":N,"rejected":M,"allow_rate":..,
    /// "max_in_window":..,"window_ns":..,"limit":..}, ...]}` on one line.
    pub fn to_json(&self) -> String {
        let results = self
            .results
            .iter()
            .map(|r| JsonRow {
                policy: &r.name,
                algorithm: r.algorithm.name(),
                allowed: r.allowed,
                rejected: r.rejected,
                allow_rate: r.allow_rate().map(|p| (p * 100.0).round() / 100.0),
                max_in_window: r.max_in_window,
                window_ns: r.window,
                limit: &r.limit,
            })
            .collect();
        serde_json::to_string(&Json { results }).expect("plain data serializes")
    }

    /// The title, the notes and an aligned table, one row per policy.
    pub fn to_table(&self) -> String {
        let header = [
            "policy",
            "algorithm",
            "limit",
            "allowed",
            "rejected",
            "allow rate",
            "max/window",
        ];
        let rows: Vec<[String; 7]> = self
            .results
            .iter()
            .map(|r| {
                [
                    r.name.clone(),
                    r.algorithm.name().to_string(),
                    r.limit.clone(),
                    r.allowed.to_string(),
                    r.rejected.to_string(),
                    r.allow_rate()
                        .map_or_else(|| "-".to_string(), |p| format!("{p:.1}%")),
                    r.max_in_window.to_string(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: [&str; 7]| {
            let mut out = String::new();
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                if i > 0 {
                    out.push_str("  ");
                }
                // Text columns left-aligned, numbers right-aligned.
                if i < 3 {
                    out.push_str(&format!("{cell:<w$}"));
                } else {
                    out.push_str(&format!("{cell:>w$}"));
                }
            }
            out.trim_end().to_string() + "\n"
        };
        let mut out = format!("{}\n", self.title);
        for note in &self.notes {
            out.push_str(&format!("  {note}\n"));
        }
        out.push('\n');
        out.push_str(&line(header));
        for row in &rows {
            out.push_str(&line(row.each_ref().map(String::as_str)));
        }
        let mut windows: Vec<Nanos> = self.results.iter().map(|r| r.window).collect();
        windows.sort_unstable();
        windows.dedup();
        let span = match windows.as_slice() {
            [w] => format!("{} s, the policies' period", seconds(*w)),
            _ => "as long as each policy's period".to_string(),
        };
        out.push_str(&format!(
            "\nmax/window: the most requests admitted for one key in any span of {span}\n"
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    fn report() -> Report {
        Report {
            title: "t".into(),
            notes: vec!["n".into()],
            results: vec![PolicyResult {
                name: "p".into(),
                algorithm: Algorithm::Gcra,
                limit: "10 per 1s, capacity 20".into(),
                allowed: 3,
                rejected: 1,
                window: SECOND,
                max_in_window: 3,
                admitted_at: vec![0, 1, 2],
                rejected_at: vec![3],
            }],
        }
    }

    #[test]
    fn seconds_are_printed_exactly_without_trailing_zeros() {
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(1_500_000_000), "1.5");
        assert_eq!(seconds(999_900_000), "0.9999");
        assert_eq!(seconds(1), "0.000000001");
        assert_eq!(seconds(u64::MAX), "18446744073.709551615");
    }

    #[test]
    fn json_starts_with_the_contracted_fields_in_order() {
        let json = report().to_json();
        assert!(
            json.starts_with(
                r#"{"results":[{"policy":"p","algorithm":"gcra","allowed":3,"rejected":1,"allow_rate":75.0,"#
            ),
            "{json}"
        );
    }

    #[test]
    fn the_table_aligns_numbers_under_their_headers() {
        let table = report().to_table();
        let lines: Vec<&str> = table.lines().collect();
        let header = lines.iter().find(|l| l.starts_with("policy")).unwrap();
        let row = lines.iter().find(|l| l.starts_with("p ")).unwrap();
        assert_eq!(header.len(), row.len(), "{table}");
        assert!(row.contains("75.0%"), "{table}");
    }
}
