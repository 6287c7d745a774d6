//! Named limits from a TOML policy file.
//!
//! ```toml
//! [limits.login]
//! algorithm = "sliding_log"   # fixed_window | sliding_log | sliding_counter | token_bucket | gcra | leaky_queue
//! limit = 5                   # requests per period (the refill rate for the bucket algorithms)
//! period = "1m"               # 1ns .. 366d, humantime syntax: "500ms", "1s", "15m", "1h", "1d"
//! burst = 5                   # bucket capacity (token_bucket, gcra, leaky_queue); default: limit
//! key_prefix = "login:"       # namespace of this limit's keys (default "NAME:"); names the key type in logs
//! shadow = false              # true: decide, log and count, but always admit
//! on_unavailable = "deny"     # deny | allow | local: the answer when the node cannot decide
//! consistency = "strict"      # strict | fast (used by the cluster)
//!
//! [inline]
//! allow = false               # accept limits given in the request (CL.THROTTLE, inline JSON)
//! ```
//!
//! Errors name the limit, the field and the fix. Limits are kept in name order so every
//! report and every iteration over them is deterministic.

use crate::limiter::{Algorithm, Limit, Nanos, MAX_PERIOD};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

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
        PolicySet {
            limits,
            options,
            inline: InlineRules::default(),
        }
    }
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

    #[test]
    fn an_empty_file_is_refused() {
        assert!(matches!(
            PolicySet::from_toml(""),
            Err(PolicyFileError::Empty)
        ));
    }
}
