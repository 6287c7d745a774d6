//! Named limits from a TOML policy file.
//!
//! ```toml
//! [limits.login]
//! algorithm = "sliding_log"   # fixed_window | sliding_log | sliding_counter | token_bucket | gcra | leaky_queue
//! limit = 5                   # requests per period (the refill rate for the bucket algorithms)
//! period = "1m"               # 1ns .. 366d, humantime syntax: "500ms", "1s", "15m", "1h", "1d"
//! burst = 5                   # bucket capacity (token_bucket, gcra, leaky_queue); default: limit
//! key_prefix = "login:"       # namespace of this limit's keys (default "NAME:"); names the key type in logs
//!                             # (not empty, not a prefix of another limit's, neither a prefix of
//!                             # "inline:" nor starting with it: see `check_key_prefixes`)
//! shadow = false              # true: decide, log and count, but always admit
//! on_unavailable = "deny"     # deny | allow | local: the answer when the node cannot decide
//! consistency = "strict"      # strict | fast (used by the cluster)
//!
//! [inline]
//! allow = false               # accept limits given in the request (CL.THROTTLE, inline JSON)
//! ```
//!
//! A limit's storage key is its `key_prefix` followed by the client's key, so two limits whose
//! prefixes are equal or one a prefix of the other could share a key's state (`api:` with the
//! client key `v2:x` is `api:v2:` with `x`): such a file is refused, as is an empty prefix and
//! one that overlaps [`INLINE_KEY_PREFIX`], the start of every inline limit's storage key.
//!
//! Errors name the limit, the field and the fix. Limits are kept in name order so every
//! report and every iteration over them is deterministic.

use crate::limiter::{Algorithm, Limit, Nanos, MAX_PERIOD};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The start of every inline limit's storage key (`inline:ALGORITHM:LIMIT:PERIOD_NS:BURST:KEY`,
/// built in `src/service/resolve.rs`): no named limit's `key_prefix` may overlap it.
pub const INLINE_KEY_PREFIX: &str = "inline:";

/// A validated set of named limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySet {
    /// The algorithm and parameters of each named limit.
    pub limits: BTreeMap<String, Limit>,
    /// How each named limit is applied (same keys as `limits`).
    pub options: BTreeMap<String, LimitOptions>,
    /// Whether requests may carry their own limits.
    pub inline: InlineRules,
}

/// The answer when a limit cannot be decided (no quorum, or the key cap is reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnavailable {
    /// Fail closed: deny (the default: a limiter is a security control).
    #[default]
    Deny,
    /// Fail open: admit, and count it in a metric.
    Allow,
    /// Each node enforces limit/N by itself until the shard is back (cluster only; a single
    /// node answers from its own state).
    Local,
}

/// When a decision is answered relative to replication (used by the cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Answer after the decision is committed on a majority.
    #[default]
    Strict,
    /// Answer at once; replicate in the next batch.
    Fast,
}

/// How a named limit is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitOptions {
    /// Namespace of the limit's keys in the shard's table, and the key type in logs.
    pub key_prefix: String,
    pub shadow: bool,
    pub on_unavailable: OnUnavailable,
    pub consistency: Consistency,
}

/// Whether requests may carry their own limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineRules {
    #[serde(default)]
    pub allow: bool,
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("cannot read policy file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("policy file is not valid TOML: {0}")]
    Toml(String),
    #[error("limit `{name}`: {message}")]
    Invalid { name: String, message: String },
    #[error("the policy file defines no limits; add a [limits.NAME] table")]
    Empty,
    /// Two limits whose storage keys can be the same (`first_prefix` is a prefix of, or equal
    /// to, `second_prefix`).
    #[error(
        "limits `{first}` (key_prefix \"{first_prefix}\") and `{second}` (key_prefix \"{second_prefix}\") \
         can share keys: a storage key is the key_prefix followed by the client's key, and {}, \
         so a client of one limit could spend or reset the other's keys (a limit without \
         `key_prefix` has \"NAME:\"); give each limit a distinct key_prefix that is not a \
         prefix of another's, each ending in `:` (\"api:\" and \"api:v2:\" overlap, \
         \"api:v1:\" and \"api:v2:\" do not)",
        overlap(first_prefix, second_prefix)
    )]
    KeyPrefixOverlap {
        first: String,
        first_prefix: String,
        second: String,
        second_prefix: String,
    },
}

fn overlap(first: &str, second: &str) -> String {
    if first == second {
        "the two prefixes are the same".into()
    } else {
        format!("\"{first}\" is a prefix of \"{second}\"")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    limits: BTreeMap<String, LimitSpec>,
    #[serde(default)]
    inline: InlineRules,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitSpec {
    algorithm: String,
    limit: u64,
    period: String,
    burst: Option<u64>,
    key_prefix: Option<String>,
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    on_unavailable: OnUnavailable,
    #[serde(default)]
    consistency: Consistency,
}

/// Parses a duration such as `"1s"`, `"250ms"`, `"1h 30m"` into nanoseconds (1ns .. 366d).
pub fn parse_period(text: &str) -> Result<Nanos, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "`period` = \"{text}\" is not a duration ({e}); write e.g. \"1s\", \"500ms\", \"15m\""
        )
    })?;
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if ns == 0 {
        return Err("`period` must be at least 1ns".into());
    }
    if ns > MAX_PERIOD {
        return Err(format!(
            "`period` = \"{text}\" is longer than the maximum of 366 days; use a shorter period"
        ));
    }
    Ok(ns)
}

impl PolicySet {
    /// Parses and validates a policy file's text.
    pub fn from_toml(text: &str) -> Result<Self, PolicyFileError> {
        let spec: FileSpec =
            toml::from_str(text).map_err(|e| PolicyFileError::Toml(e.to_string()))?;
        if spec.limits.is_empty() {
            return Err(PolicyFileError::Empty);
        }
        let mut limits = BTreeMap::new();
        let mut options = BTreeMap::new();
        for (name, l) in spec.limits {
            let invalid = |message: String| PolicyFileError::Invalid {
                name: name.clone(),
                message,
            };
            let algorithm = Algorithm::from_name(&l.algorithm).map_err(invalid)?;
            let period = parse_period(&l.period).map_err(invalid)?;
            let burst = l.burst.unwrap_or(l.limit);
            let limit = Limit::new(algorithm, l.limit, period, burst)
                .map_err(|e| invalid(e.to_string()))?;
            let key_prefix = l.key_prefix.unwrap_or_else(|| format!("{name}:"));
            if key_prefix.len() > 64 {
                return Err(invalid(
                    "`key_prefix` is longer than 64 bytes; use a short namespace".into(),
                ));
            }
            options.insert(
                name.clone(),
                LimitOptions {
                    key_prefix,
                    shadow: l.shadow,
                    on_unavailable: l.on_unavailable,
                    consistency: l.consistency,
                },
            );
            limits.insert(name, limit);
        }
        check_key_prefixes(&options)?;
        Ok(PolicySet {
            limits,
            options,
            inline: spec.inline,
        })
    }

    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Self, PolicyFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// A named limit with its options.
    pub fn get(&self, name: &str) -> Option<(&Limit, &LimitOptions)> {
        Some((self.limits.get(name)?, self.options.get(name)?))
    }

    /// The names of the limits, for error messages.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.limits.keys().map(String::as_str).collect();
        names.join(", ")
    }

    /// The policies a node runs with when given no file: the shipped
    /// `quorate.toml`, compiled in.
    pub fn default_policies() -> Self {
        Self::from_toml(include_str!("../../quorate.toml"))
            .expect("the shipped policy file is valid")
    }

    /// The classic comparison set: limit 10 per 1 s for the three window algorithms;
    /// token bucket and GCRA at 10/s with capacity 20.
    pub fn comparison() -> Self {
        let mk = |a, burst| Limit::new(a, 10, crate::limiter::SECOND, burst).expect("valid");
        let limits = [
            ("fixed_window", mk(Algorithm::FixedWindow, 10)),
            ("sliding_log", mk(Algorithm::SlidingLog, 10)),
            ("sliding_counter", mk(Algorithm::SlidingCounter, 10)),
            ("token_bucket", mk(Algorithm::TokenBucket, 20)),
            ("gcra", mk(Algorithm::Gcra, 20)),
        ]
        .into_iter()
        .map(|(n, l)| (n.to_string(), l))
        .collect();
        Self::from_limits(limits)
    }

    /// Limits with the default options (prefix "NAME:", strict, deny, not shadow) and no
    /// inline limits: for the simulator's built-in sets.
    pub fn from_limits(limits: BTreeMap<String, Limit>) -> Self {
        let options = limits
            .keys()
            .map(|n| {
                let o = LimitOptions {
                    key_prefix: format!("{n}:"),
                    shadow: false,
                    on_unavailable: OnUnavailable::Deny,
                    consistency: Consistency::Strict,
                };
                (n.clone(), o)
            })
            .collect();
        debug_assert!(check_key_prefixes(&options).is_ok());
        PolicySet {
            limits,
            options,
            inline: InlineRules::default(),
        }
    }
}

/// Refuses key prefixes under which two limits could share a storage key (`key_prefix` then
/// the client's key, which is never empty): an empty prefix (it is a prefix of every other), a
/// prefix that overlaps [`INLINE_KEY_PREFIX`] either way (whether or not `[inline] allow` is
/// set: keys keep their state across a reload that turns it on), and two prefixes one of which
/// is a prefix of the other, equal included. Prefixes that are not prefixes of one another
/// differ at some byte before the shorter one ends, so no key of one is a key of the other.
fn check_key_prefixes(options: &BTreeMap<String, LimitOptions>) -> Result<(), PolicyFileError> {
    for (name, o) in options {
        let p = o.key_prefix.as_str();
        let invalid = |message: String| PolicyFileError::Invalid {
            name: name.clone(),
            message,
        };
        if p.is_empty() {
            return Err(invalid(format!(
                "`key_prefix` is empty: a storage key is the key_prefix followed by the client's \
                 key, so this limit's keys would include every other limit's and every inline \
                 limit's; give it a namespace of its own, e.g. \"{name}:\" (the default)"
            )));
        }
        if INLINE_KEY_PREFIX.starts_with(p) || p.starts_with(INLINE_KEY_PREFIX) {
            let default = if p == format!("{name}:") {
                " (the default, from the limit's name)"
            } else {
                ""
            };
            return Err(invalid(format!(
                "`key_prefix` \"{p}\"{default} overlaps \"{INLINE_KEY_PREFIX}\", the start of \
                 every inline limit's storage key (CL.THROTTLE, inline JSON limits), so a client \
                 could spend or reset an inline limit's keys through this limit or the reverse; \
                 set a key_prefix that neither starts with \"{INLINE_KEY_PREFIX}\" nor is a prefix \
                 of it, e.g. \"{name}_limit:\""
            )));
        }
    }
    // In byte order a prefix comes just before the strings that extend it, and every string
    // between the two extends it too: if any prefix is a prefix of another, some neighbour is.
    let mut sorted: Vec<(&str, &str)> = options
        .iter()
        .map(|(name, o)| (o.key_prefix.as_str(), name.as_str()))
        .collect();
    sorted.sort_unstable();
    for pair in sorted.windows(2) {
        let [(first_prefix, first), (second_prefix, second)] = pair else {
            unreachable!("windows of two")
        };
        if second_prefix.starts_with(first_prefix) {
            return Err(PolicyFileError::KeyPrefixOverlap {
                first: first.to_string(),
                first_prefix: first_prefix.to_string(),
                second: second.to_string(),
                second_prefix: second_prefix.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_policy_file_with_every_algorithm() {
        let text = r#"
            [limits.a]
            algorithm = "fixed_window"
            limit = 10
            period = "1s"
            [limits.b]
            algorithm = "token_bucket"
            limit = 10
            period = "1s"
            burst = 20
            [limits.c]
            algorithm = "leaky_queue"
            limit = 3
            period = "250ms"
        "#;
        let set = PolicySet::from_toml(text).unwrap();
        assert_eq!(set.limits.len(), 3);
        assert_eq!(set.limits["b"].capacity(), 20);
        assert_eq!(set.limits["c"].capacity(), 3);
    }

    #[test]
    fn an_unknown_algorithm_is_refused_with_the_accepted_names() {
        let text = "[limits.x]\nalgorithm = \"magic\"\nlimit = 1\nperiod = \"1s\"\n";
        let err = PolicySet::from_toml(text).unwrap_err().to_string();
        assert!(
            err.contains("limit `x`") && err.contains("token_bucket"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_period_names_the_field_and_the_fix() {
        let text = "[limits.x]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"soon\"\n";
        let err = PolicySet::from_toml(text).unwrap_err().to_string();
        assert!(err.contains("`period`") && err.contains("500ms"), "{err}");
        let text = "[limits.x]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"400d\"\n";
        let err = PolicySet::from_toml(text).unwrap_err().to_string();
        assert!(err.contains("366 days"), "{err}");
    }

    #[test]
    fn a_zero_limit_and_an_unknown_field_are_refused() {
        let text = "[limits.x]\nalgorithm = \"gcra\"\nlimit = 0\nperiod = \"1s\"\n";
        assert!(PolicySet::from_toml(text)
            .unwrap_err()
            .to_string()
            .contains("`limit`"));
        let text = "[limits.x]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nbrust = 3\n";
        assert!(PolicySet::from_toml(text)
            .unwrap_err()
            .to_string()
            .contains("brust"));
    }

    #[test]
    fn options_default_to_strict_deny_not_shadow_with_the_name_as_prefix() {
        let text = "[limits.x]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n";
        let set = PolicySet::from_toml(text).unwrap();
        let (_, o) = set.get("x").unwrap();
        assert_eq!(o.key_prefix, "x:");
        assert!(!o.shadow && !set.inline.allow);
        assert_eq!(
            (o.on_unavailable, o.consistency),
            (OnUnavailable::Deny, Consistency::Strict)
        );
        let text = "[limits.x]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\non_unavailable = \"maybe\"\n";
        let err = PolicySet::from_toml(text).unwrap_err().to_string();
        assert!(err.contains("deny") && err.contains("allow"), "{err}");
    }

    #[test]
    fn the_shipped_default_policies_are_valid() {
        let set = PolicySet::default_policies();
        assert!(set.get("login").is_some() && set.get("api").is_some());
    }

    /// A policy file of gcra limits, each `(name, key_prefix or None for the default)`.
    fn limits_with_prefixes(limits: &[(&str, Option<&str>)]) -> String {
        let mut text = String::from("[inline]\nallow = true\n");
        for (name, prefix) in limits {
            text.push_str(&format!(
                "[limits.\"{name}\"]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n"
            ));
            if let Some(p) = prefix {
                text.push_str(&format!("key_prefix = \"{p}\"\n"));
            }
        }
        text
    }

    /// The names and prefixes of the two limits an overlap is reported for, first the one
    /// whose prefix is the shorter.
    fn overlap_of(limits: &[(&str, Option<&str>)]) -> (String, String, String, String) {
        match PolicySet::from_toml(&limits_with_prefixes(limits)) {
            Err(e @ PolicyFileError::KeyPrefixOverlap { .. }) => {
                let message = e.to_string();
                let PolicyFileError::KeyPrefixOverlap {
                    first,
                    first_prefix,
                    second,
                    second_prefix,
                } = e
                else {
                    unreachable!()
                };
                for text in [&first, &first_prefix, &second, &second_prefix] {
                    assert!(message.contains(text.as_str()), "{message}");
                }
                assert!(message.contains("not a prefix of another"), "{message}");
                (first, first_prefix, second, second_prefix)
            }
            other => panic!("{limits:?}: expected an overlap, got {other:?}"),
        }
    }

    fn owned(a: &str, b: &str, c: &str, d: &str) -> (String, String, String, String) {
        (a.into(), b.into(), c.into(), d.into())
    }

    #[test]
    fn two_limits_with_the_same_key_prefix_are_refused() {
        // With different algorithms each check would replace the other's state with a fresh
        // one (both admit every time); with the same one they would count each other's units.
        let err = overlap_of(&[("login", Some("user:")), ("signup", Some("user:"))]);
        assert_eq!(err, owned("login", "user:", "signup", "user:"));
        let message = PolicySet::from_toml(&limits_with_prefixes(&[
            ("login", Some("user:")),
            ("signup", Some("user:")),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            message.contains("the two prefixes are the same"),
            "{message}"
        );
        // An explicit prefix equal to another limit's default.
        let err = overlap_of(&[("api", None), ("other", Some("api:"))]);
        assert_eq!(err, owned("api", "api:", "other", "api:"));
    }

    #[test]
    fn a_key_prefix_that_is_a_prefix_of_another_is_refused_in_either_order() {
        // `api:` with the client key `v2:x` is `api:v2:` with `x`.
        let want = owned("v1", "api:", "v2", "api:v2:");
        assert_eq!(
            overlap_of(&[("v1", Some("api:")), ("v2", Some("api:v2:"))]),
            want
        );
        let want = owned("v2", "api:", "v1", "api:v2:");
        assert_eq!(
            overlap_of(&[("v1", Some("api:v2:")), ("v2", Some("api:"))]),
            want
        );
        // A third limit in between in byte order does not hide the overlap.
        assert_eq!(
            overlap_of(&[
                ("a", Some("api:")),
                ("b", Some("api:b:")),
                ("c", Some("api:z:"))
            ]),
            owned("a", "api:", "b", "api:b:")
        );
        // Without a separator too: "ip" is a prefix of "ipv6:".
        assert_eq!(
            overlap_of(&[("v4", Some("ip")), ("v6", Some("ipv6:"))]),
            owned("v4", "ip", "v6", "ipv6:")
        );
    }

    #[test]
    fn the_default_prefixes_of_limits_named_a_and_a_b_overlap() {
        assert_eq!(
            overlap_of(&[("a", None), ("a:b", None)]),
            owned("a", "a:", "a:b", "a:b:")
        );
    }

    #[test]
    fn distinct_prefixes_that_are_not_prefixes_of_one_another_are_accepted() {
        let text = limits_with_prefixes(&[
            ("v1", Some("api:")),
            ("v2", Some("apiv2:")),
            ("v3", Some("api;")),
            ("login", None),
            ("login_ip", None),
            ("log", None),
            ("inline_like", None),
            ("x", Some("inlinE:")),
        ]);
        let set = PolicySet::from_toml(&text).unwrap();
        assert_eq!(set.options["v2"].key_prefix, "apiv2:");
        assert_eq!(set.options["login_ip"].key_prefix, "login_ip:");
    }

    #[test]
    fn an_empty_key_prefix_is_refused() {
        for limits in [
            &[("only", Some(""))][..],
            &[("only", Some("")), ("other", None)][..],
        ] {
            let err = PolicySet::from_toml(&limits_with_prefixes(limits))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("limit `only`") && err.contains("`key_prefix` is empty"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_key_prefix_that_overlaps_the_inline_limits_keys_is_refused() {
        // Whether or not inline limits are allowed: a reload may allow them, keys kept.
        for (name, prefix) in [
            ("inline", None),
            ("x", Some("inline:")),
            ("x", Some("inl")),
            ("x", Some("inline:gcra:")),
            ("x", Some("inline:anything")),
        ] {
            for allow in ["true", "false"] {
                let text = limits_with_prefixes(&[(name, prefix)])
                    .replace("allow = true", &format!("allow = {allow}"));
                let err = PolicySet::from_toml(&text).unwrap_err().to_string();
                assert!(
                    err.contains(&format!("limit `{name}`")) && err.contains("\"inline:\""),
                    "{prefix:?}: {err}"
                );
            }
        }
    }

    #[test]
    fn the_deployments_policy_files_are_valid() {
        // Read, not compiled in: scripts/negative-controls builds a copy without deploy/.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
        let compose = std::fs::read_to_string(root.join("policies.toml")).unwrap();
        PolicySet::from_toml(&compose).unwrap();
        // The Kubernetes ConfigMap's `policies.toml: |` block, indented by four spaces.
        let k8s = std::fs::read_to_string(root.join("k8s/quorate.yaml")).unwrap();
        let block: String = k8s
            .lines()
            .skip_while(|l| l.trim() != "policies.toml: |")
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.trim_start()))
            .collect();
        let set = PolicySet::from_toml(&block).unwrap();
        assert!(set.get("login").is_some() && set.get("api").is_some());
    }

    #[test]
    fn an_empty_file_is_refused() {
        assert!(matches!(
            PolicySet::from_toml(""),
            Err(PolicyFileError::Empty)
        ));
    }
}
