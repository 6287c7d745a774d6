//! Parsing arrival traces: one arrival per line, `SECONDS [KEY]`.
//!
//! Why a hand-written parser: trace times must become shard time (integer nanoseconds)
//! *exactly*. Going through `f64` would turn `0.3` into 299_999_999 ns and make boundary
//! scenarios land on the wrong side of a window, so [`parse_seconds`] reads the decimal digits
//! as integers, refuses anything it cannot represent exactly (more than nine significant
//! fractional digits, values past `u64` nanoseconds) and never panics.
//!
//! Format: blank lines and lines starting with `#` are skipped; the first column is the
//! arrival time in seconds since the start of the trace (trace time 0 is shard time 0); an
//! optional second column is the key (default `-`). Times must not decrease. Every error names
//! the file and the line.

use super::{Arrival, Workload};
use crate::limiter::{Nanos, SECOND};
use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

/// The key of arrivals whose line has no key column.
pub const DEFAULT_KEY: &str = "-";

/// Why a time column was refused. Displayed after `time "TEXT" `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecondsError {
    #[error("is not a number of seconds (write a plain decimal such as 1.5 or 2)")]
    NotANumber,
    #[error("is negative; trace times are seconds since the start of the trace")]
    Negative,
    #[error(
        "has {0} fractional digits; at most 9 (nanoseconds) are supported, and the value is refused rather than truncated"
    )]
    TooPrecise(usize),
    #[error("is too large (at most 18446744073.709551615 seconds)")]
    TooLarge,
}

/// Parses a non-negative decimal number of seconds (`"2"`, `"1.5"`, `".25"`, `"3."`) into
/// nanoseconds, exactly: no floats, no rounding. Fractional digits past the ninth are
/// accepted only when they are zeros.
pub fn parse_seconds(text: &str) -> Result<Nanos, SecondsError> {
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) {
        return Err(SecondsError::NotANumber);
    }
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    if negative && (nonzero(int) || nonzero(frac)) {
        return Err(SecondsError::Negative);
    }
    let (kept, extra) = frac.split_at(frac.len().min(9));
    if nonzero(extra) {
        return Err(SecondsError::TooPrecise(frac.len()));
    }
    let mut secs: u64 = 0;
    for b in int.bytes() {
        secs = secs
            .checked_mul(10)
            .and_then(|s| s.checked_add(u64::from(b - b'0')))
            .ok_or(SecondsError::TooLarge)?;
    }
    let mut nanos: u64 = 0;
    for b in kept.bytes() {
        nanos = nanos * 10 + u64::from(b - b'0');
    }
    nanos *= 10u64.pow(9 - kept.len() as u32);
    secs.checked_mul(SECOND)
        .and_then(|s| s.checked_add(nanos))
        .ok_or(SecondsError::TooLarge)
}

/// A trace that could not be read, with the file and (for content errors) the line.
#[derive(Debug)]
pub struct TraceError {
    /// The trace's path as given.
    pub path: String,
    /// 1-based line number; `None` when the file itself could not be read.
    pub line: Option<usize>,
    pub problem: Problem,
}

/// What is wrong with a trace.
#[derive(Debug)]
pub enum Problem {
    Read(std::io::Error),
    NotUtf8,
    Time {
        text: String,
        error: SecondsError,
    },
    Unsorted {
        time: Nanos,
        previous: Nanos,
        previous_line: usize,
    },
    Columns(usize),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            None => write!(f, "cannot read trace {}", self.path)?,
            Some(line) => write!(f, "{} line {line}", self.path)?,
        }
        match &self.problem {
            Problem::Read(e) => write!(f, ": {e}"),
            Problem::NotUtf8 => write!(f, ": not UTF-8 text"),
            Problem::Time { text, error } => write!(f, ": time \"{}\" {error}", shorten(text)),
            Problem::Unsorted {
                time,
                previous,
                previous_line,
            } => write!(
                f,
                ": time {} s is earlier than {} s on line {previous_line}; sort the trace by time",
                super::report::seconds(*time),
                super::report::seconds(*previous),
            ),
            Problem::Columns(n) => write!(
                f,
                ": {n} columns; expected `SECONDS` or `SECONDS KEY` (whitespace-separated)"
            ),
        }
    }
}

impl std::error::Error for TraceError {}

/// At most 40 characters of user text in a message.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// The largest trace file read (a line is a few bytes, so this is tens of millions of
/// arrivals; beyond it, split the trace).
pub const MAX_TRACE_BYTES: u64 = 256 << 20;

/// Reads and parses a trace file.
pub fn load(path: &Path) -> Result<Workload, TraceError> {
    let label = path.display().to_string();
    let read_error = |e| TraceError {
        path: label.clone(),
        line: None,
        problem: Problem::Read(e),
    };
    // Bounded read: `/dev/zero` or an endless pipe must not take all memory.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TRACE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_TRACE_BYTES {
        return Err(read_error(std::io::Error::other(format!(
            "larger than {} MiB; split the trace",
            MAX_TRACE_BYTES >> 20
        ))));
    }
    parse(&bytes, &label)
}

/// Parses a trace's contents; `label` names the trace in errors.
pub fn parse(bytes: &[u8], label: &str) -> Result<Workload, TraceError> {
    let mut workload = Workload::default();
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut previous: Option<(Nanos, usize)> = None;
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let err = |problem| TraceError {
            path: label.to_string(),
            line: Some(line),
            problem,
        };
        let text = std::str::from_utf8(raw).map_err(|_| err(Problem::NotUtf8))?;
        // Editors on Windows may start the file with a byte-order mark.
        let text = if line == 1 {
            text.trim_start_matches('\u{feff}')
        } else {
            text
        };
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let columns: Vec<&str> = text.split_whitespace().collect();
        if columns.len() > 2 {
            return Err(err(Problem::Columns(columns.len())));
        }
        let at = parse_seconds(columns[0]).map_err(|error| {
            err(Problem::Time {
                text: columns[0].to_string(),
                error,
            })
        })?;
        if let Some((prev, prev_line)) = previous {
            if at < prev {
                return Err(err(Problem::Unsorted {
                    time: at,
                    previous: prev,
                    previous_line: prev_line,
                }));
            }
        }
        previous = Some((at, line));
        let name = columns.get(1).copied().unwrap_or(DEFAULT_KEY);
        let key = match ids.get(name) {
            Some(&k) => k,
            None => {
                let k = workload.keys.len();
                workload.keys.push(name.to_string());
                ids.insert(name.to_string(), k);
                k
            }
        };
        workload.arrivals.push(Arrival { at, key });
    }
    Ok(workload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_seconds_become_exact_nanoseconds() {
        assert_eq!(parse_seconds("1.5"), Ok(1_500_000_000));
        assert_eq!(parse_seconds("0.3"), Ok(300_000_000));
        assert_eq!(parse_seconds("2"), Ok(2 * SECOND));
        assert_eq!(parse_seconds(".25"), Ok(250_000_000));
        assert_eq!(parse_seconds("3."), Ok(3 * SECOND));
        assert_eq!(parse_seconds("+1"), Ok(SECOND));
        assert_eq!(parse_seconds("0.000000001"), Ok(1));
        assert_eq!(parse_seconds("0.9999"), Ok(999_900_000));
        assert_eq!(parse_seconds("-0"), Ok(0));
        assert_eq!(parse_seconds("18446744073.709551615"), Ok(u64::MAX));
    }

    #[test]
    fn trailing_zeros_past_nanoseconds_are_exact_and_accepted() {
        assert_eq!(parse_seconds("1.0000000010000"), Ok(SECOND + 1));
    }

    #[test]
    fn digits_that_would_be_lost_are_refused() {
        assert_eq!(
            parse_seconds("1.0000000001"),
            Err(SecondsError::TooPrecise(10))
        );
    }

    #[test]
    fn values_past_u64_nanoseconds_are_too_large_not_a_panic() {
        assert_eq!(
            parse_seconds("18446744073.709551616"),
            Err(SecondsError::TooLarge)
        );
        assert_eq!(
            parse_seconds("99999999999999999999999999"),
            Err(SecondsError::TooLarge)
        );
    }

    #[test]
    fn non_numbers_and_negatives_are_refused() {
        for bad in ["abc", "", ".", "1e3", "1.2.3", "--1", "1,5", "0x10", "١"] {
            assert_eq!(parse_seconds(bad), Err(SecondsError::NotANumber), "{bad}");
        }
        assert_eq!(parse_seconds("-1"), Err(SecondsError::Negative));
        assert_eq!(parse_seconds("-0.5"), Err(SecondsError::Negative));
    }

    #[test]
    fn comments_blank_lines_and_keys_are_understood() {
        let w = parse(b"# header\n\n0 alice\n0.5 bob\r\n1 alice\n  \n1", "t").unwrap();
        assert_eq!(w.keys, ["alice", "bob", DEFAULT_KEY]);
        let got: Vec<_> = w.arrivals.iter().map(|a| (a.at, a.key)).collect();
        assert_eq!(got, [(0, 0), (SECOND / 2, 1), (SECOND, 0), (SECOND, 2)]);
    }

    #[test]
    fn errors_name_the_file_and_the_line() {
        let e = parse(b"0\n1\nabc\n", "trace.txt").unwrap_err().to_string();
        assert_eq!(
            e,
            "trace.txt line 3: time \"abc\" is not a number of seconds (write a plain decimal such as 1.5 or 2)"
        );
        let e = parse(b"2\n1\n", "t").unwrap_err().to_string();
        assert!(
            e.starts_with("t line 2: time 1 s is earlier than 2 s on line 1"),
            "{e}"
        );
        let e = parse(b"1 a b\n", "t").unwrap_err().to_string();
        assert!(e.starts_with("t line 1: 3 columns"), "{e}");
        let e = parse(b"1\n\xff\n", "t").unwrap_err().to_string();
        assert_eq!(e, "t line 2: not UTF-8 text");
    }

    proptest::proptest! {
        #[test]
        fn no_bytes_make_the_parser_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)
        ) {
            let _ = parse(&bytes, "t");
        }

        #[test]
        fn no_trace_like_text_makes_the_parser_panic(text in "[0-9.+\\- #a\n\r\t]{0,120}") {
            let _ = parse(text.as_bytes(), "t");
        }

        #[test]
        fn every_nanosecond_count_round_trips_through_its_decimal_text(ns: u64) {
            proptest::prop_assert_eq!(parse_seconds(&crate::sim::report::seconds(ns)), Ok(ns));
        }
    }

    #[test]
    fn equal_times_are_in_order() {
        assert_eq!(parse(b"1\n1\n1\n", "t").unwrap().arrivals.len(), 3);
    }
}
