//! `quorate sim ...` as a user runs it: the real binary, real files, exit codes and output.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Output};

/// The `quorate` binary with the given arguments and environment, and no inherited
/// `QUORATE_*` variables.
fn quorate_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quorate"));
    for (name, _) in std::env::vars() {
        if name.starts_with("QUORATE_") {
            cmd.env_remove(name);
        }
    }
    cmd.args(args).envs(env.iter().copied());
    cmd.output().expect("the quorate binary runs")
}

fn quorate(args: &[&str]) -> Output {
    quorate_env(args, &[])
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn file(contents: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(contents).unwrap();
    f.flush().unwrap();
    f
}

fn path(f: &tempfile::NamedTempFile) -> &str {
    f.path().to_str().unwrap()
}

/// policy name -> (allowed, rejected, max_in_window), from `--json` output.
fn results(out: &Output) -> BTreeMap<String, (u64, u64, u64)> {
    let v: Value = serde_json::from_str(&stdout(out)).expect("--json prints JSON");
    v["results"]
        .as_array()
        .expect("a results array")
        .iter()
        .map(|r| {
            let n = |field: &str| {
                r[field]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{field} in {r}"))
            };
            (
                r["policy"].as_str().unwrap().to_string(),
                (n("allowed"), n("rejected"), n("max_in_window")),
            )
        })
        .collect()
}

fn allowed(out: &Output) -> Vec<(String, u64)> {
    results(out).into_iter().map(|(k, v)| (k, v.0)).collect()
}

fn pairs(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut v: Vec<_> = expected.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    v.sort();
    v
}

#[test]
fn a_burst_of_25_at_one_instant_meets_each_algorithms_capacity() {
    let trace = file("0\n".repeat(25).as_bytes());
    let out = quorate(&["sim", "replay", "--trace", path(&trace), "--json"]);
    assert_eq!(
        allowed(&out),
        pairs(&[
            ("fixed_window", 10),
            ("sliding_log", 10),
            ("sliding_counter", 10),
            ("token_bucket", 20),
            ("gcra", 20),
        ])
    );
    for (name, (a, r, _)) in results(&out) {
        assert_eq!(a + r, 25, "{name}");
    }
}

#[test]
fn json_output_is_exactly_a_results_array_of_the_contracted_fields() {
    let trace = file(b"# comment\n\n0\n0.5\n1.000000001\n");
    let text = stdout(&quorate(&[
        "sim",
        "replay",
        "--trace",
        path(&trace),
        "--json",
    ]));
    assert!(text.starts_with(r#"{"results":[{"policy":""#), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 1, "only `results` at the top");
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    // The contracted fields come first, in order, in every row (checked on the raw text:
    // serde_json's map sorts keys).
    let raw_rows: Vec<&str> = text.split(r#"{"policy":"#).skip(1).collect();
    assert_eq!(raw_rows.len(), 5);
    for raw in raw_rows {
        let at = |field: &str| raw.find(&format!("\"{field}\":")).unwrap_or(usize::MAX);
        assert!(
            at("algorithm") < at("allowed") && at("allowed") < at("rejected"),
            "{raw}"
        );
        assert!(
            at("rejected") < at("allow_rate"),
            "extra fields come after: {raw}"
        );
    }
    for row in rows {
        assert!(row["policy"].is_string() && row["algorithm"].is_string());
        assert_eq!(row["allowed"].as_u64(), Some(3));
        assert_eq!(row["rejected"].as_u64(), Some(0));
    }
}

#[test]
fn the_table_has_a_row_per_policy_with_counts_and_rates() {
    let trace = file("0\n".repeat(25).as_bytes());
    let text = stdout(&quorate(&["sim", "replay", "--trace", path(&trace)]));
    assert!(
        text.contains("allowed") && text.contains("max/window"),
        "{text}"
    );
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row {name}: {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(row("sliding_log").ends_with("10 15 40.0% 10"), "{text}");
    assert!(row("gcra").ends_with("20 5 80.0% 20"), "{text}");
}

#[test]
fn bad_traces_exit_2_with_the_file_and_line_on_stderr() {
    let cases: [(&[u8], &str, &str); 8] = [
        (
            b"0\n1\nabc\n",
            "line 3",
            "time \"abc\" is not a number of seconds",
        ),
        (b"0\n-1\n", "line 2", "negative"),
        (b"0\n2\n# fine\n1\n", "line 4", "earlier than 2 s on line 2"),
        (b"0 key extra\n", "line 1", "3 columns"),
        (b"1.0000000001\n", "line 1", "10 fractional digits"),
        (b"0\n99999999999999999999\n", "line 2", "too large"),
        (b"0\n1e3\n", "line 2", "not a number"),
        (b"0\n\xff\xfe\n", "line 2", "not UTF-8"),
    ];
    for (contents, line, message) in cases {
        let trace = file(contents);
        let out = quorate(&["sim", "replay", "--trace", path(&trace)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(out.stdout.is_empty());
        let expected = format!("error: {} {line}: ", path(&trace));
        assert!(stderr.starts_with(&expected), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
    }
}

#[test]
fn an_unreadable_trace_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.txt");
    let out = quorate(&["sim", "replay", "--trace", missing.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: cannot read trace "), "{stderr}");
    assert!(stderr.contains("missing.txt"), "{stderr}");
}

#[test]
fn each_key_of_a_trace_gets_its_own_allowance() {
    let trace = file("0 alice\n0 bob\n".repeat(25).as_bytes());
    let out = quorate(&["sim", "replay", "--trace", path(&trace), "--json"]);
    let r = results(&out);
    assert_eq!(r["fixed_window"], (20, 30, 10));
    assert_eq!(r["sliding_log"], (20, 30, 10));
    assert_eq!(r["token_bucket"], (40, 10, 20));
    assert_eq!(r["gcra"], (40, 10, 20));
}

#[test]
fn a_policy_file_replaces_the_comparison_set() {
    let policies = file(
        b"[limits.login]\nalgorithm = \"sliding_log\"\nlimit = 3\nperiod = \"1s\"\n\
          [limits.queue]\nalgorithm = \"leaky_queue\"\nlimit = 1\nperiod = \"1s\"\nburst = 2\n",
    );
    let trace = file(b"0\n0\n0\n0\n0\n");
    let out = quorate(&[
        "sim",
        "replay",
        "--trace",
        path(&trace),
        "--policies",
        path(&policies),
        "--json",
    ]);
    assert_eq!(allowed(&out), pairs(&[("login", 3), ("queue", 2)]));
}

#[test]
fn a_bad_policy_file_exits_2_naming_the_file_and_the_limit() {
    let policies = file(b"[limits.x]\nalgorithm = \"magic\"\nlimit = 1\nperiod = \"1s\"\n");
    let trace = file(b"0\n");
    let out = quorate(&[
        "sim",
        "replay",
        "--trace",
        path(&trace),
        "--policies",
        path(&policies),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(path(&policies)) && stderr.contains("limit `x`"),
        "{stderr}"
    );
}

#[test]
fn flags_can_come_from_the_environment() {
    let trace = file("0\n".repeat(25).as_bytes());
    let out = quorate_env(
        &["sim", "replay"],
        &[("QUORATE_TRACE", path(&trace)), ("QUORATE_JSON", "true")],
    );
    assert_eq!(results(&out)["gcra"].0, 20);
}

#[test]
fn poisson_with_a_seed_is_reproducible() {
    let args = [
        "sim",
        "poisson",
        "--rate",
        "20",
        "--duration",
        "5",
        "--seed",
        "42",
    ];
    let a = stdout(&quorate(&args));
    assert_eq!(a, stdout(&quorate(&args)));
    let mut other = args;
    other[7] = "43";
    assert_ne!(a, stdout(&quorate(&other)));
    let json = ["sim", "poisson", "--seed", "42", "--keys", "3", "--json"];
    assert_eq!(stdout(&quorate(&json)), stdout(&quorate(&json)));
}

#[test]
fn at_60_percent_of_the_rate_buckets_reject_fewer_than_windows() {
    let out = quorate(&[
        "sim",
        "poisson",
        "--rate",
        "6",
        "--duration",
        "60",
        "--seed",
        "1",
        "--json",
    ]);
    let r = results(&out);
    for bucket in ["token_bucket", "gcra"] {
        for window in ["fixed_window", "sliding_log", "sliding_counter"] {
            assert!(r[bucket].1 < r[window].1, "{bucket} vs {window}: {r:?}");
        }
        // Nearly everything: at most 1% rejected.
        assert!(r[bucket].1 * 100 <= r[bucket].0 + r[bucket].1, "{r:?}");
    }
}

#[test]
fn nonsense_poisson_parameters_exit_2() {
    for args in [
        &["--rate", "0"][..],
        &["--rate", "-3"],
        &["--rate", "NaN"],
        &["--keys", "0"],
        &["--duration", "0"],
        &["--duration", "soon"],
        &["--rate", "1000000", "--duration", "1d"],
    ] {
        let mut all = vec!["sim", "poisson"];
        all.extend_from_slice(args);
        let out = quorate(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
}

#[test]
fn the_boundary_burst_gets_twice_the_limit_only_through_the_fixed_window() {
    let text = stdout(&quorate(&["sim", "boundary"]));
    assert!(
        text.contains("capacity 10"),
        "the header states the bucket capacity: {text}"
    );
    let r = results(&quorate(&["sim", "boundary", "--json"]));
    assert_eq!(r["fixed_window"], (20, 0, 20));
    for name in ["sliding_log", "token_bucket", "gcra"] {
        let (allowed, _, max) = r[name];
        assert!(allowed <= 10 && max <= 10, "{name}: {r:?}");
    }
    // The sliding counter floors the previous window's weighted count, so it may admit one
    // over the limit: approximate, but nowhere near the fixed window's 20.
    let (allowed, _, max) = r["sliding_counter"];
    assert!(allowed <= 11 && max <= 11, "{r:?}");
}

#[test]
fn plot_writes_an_svg_with_one_group_per_policy() {
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("boundary.svg");
    let svg_arg = svg_path.to_str().unwrap();
    stdout(&quorate(&["sim", "boundary", "--plot", svg_arg]));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"));
    assert_eq!(svg.matches("<g class=\"policy\"").count(), 5);
    for name in [
        "fixed_window",
        "sliding_log",
        "sliding_counter",
        "token_bucket",
        "gcra",
    ] {
        assert!(svg.contains(&format!("data-policy=\"{name}\"")), "{name}");
    }

    let trace = file(b"0 a\n0.5 b\n2 a\n");
    let replay_svg = dir.path().join("replay.svg");
    let out = quorate(&[
        "sim",
        "replay",
        "--trace",
        path(&trace),
        "--plot",
        replay_svg.to_str().unwrap(),
        "--json",
    ]);
    results(&out);
    assert!(std::fs::read_to_string(&replay_svg)
        .unwrap()
        .starts_with("<svg"));
}

#[test]
fn an_unwritable_plot_path_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("no/such/dir/plot.svg");
    let out = quorate(&["sim", "boundary", "--plot", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: cannot write plot "), "{stderr}");
}

#[test]
fn help_names_every_scenario_and_its_environment_variables() {
    let help = stdout(&quorate(&["sim", "--help"]));
    for scenario in ["replay", "poisson", "boundary"] {
        assert!(help.contains(scenario), "{help}");
    }
    let help = stdout(&quorate(&["sim", "poisson", "--help"]));
    for var in [
        "QUORATE_RATE",
        "QUORATE_DURATION",
        "QUORATE_SEED",
        "QUORATE_KEYS",
        "QUORATE_POLICIES",
        "QUORATE_JSON",
        "QUORATE_PLOT",
    ] {
        assert!(help.contains(var), "{var}: {help}");
    }
}

#[test]
fn a_trace_starting_with_a_byte_order_mark_is_read() {
    let trace = file(b"\xEF\xBB\xBF0\n0.5\n");
    let out = quorate(&["sim", "replay", "--trace", path(&trace), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(results(&out)["fixed_window"].0, 2);
}

#[test]
fn a_negative_rate_gets_quorates_own_message_with_the_fix() {
    let out = quorate(&["sim", "poisson", "--rate", "-1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rate") && err.contains("positive"), "{err}");
    let out = quorate(&["sim", "poisson", "--duration", "-1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("positive number of seconds"), "{err}");
}

#[test]
fn poisson_arrivals_at_one_per_nanosecond_keep_their_rate() {
    // Rounding each gap to whole nanoseconds once ran 4% fast; time is summed in picoseconds.
    let out = quorate(&[
        "sim",
        "poisson",
        "--rate",
        "1e9",
        "--duration",
        "0.001",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (allowed, rejected, _) = results(&out)["fixed_window"];
    let n = allowed + rejected;
    assert!(
        (990_000..1_010_000).contains(&n),
        "{n} arrivals, expected about 1,000,000"
    );
}
