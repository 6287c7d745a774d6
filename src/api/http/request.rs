//! The JSON body of `POST /v1/check`, validated into a [`CheckRequest`].
//!
//! Parsed by hand from a `serde_json::Value` rather than derived, because hostile and
//! mistaken input is the normal case here: every refusal names the exact field
//! (`checks[1].cost`), what was wrong with it and the fix, and unknown fields are refused
//! so that a typo (`"cots": 5`) is never silently read as the default.

use super::reject::{quote, Reject};
use crate::config::NodeConfig;
use crate::limiter::{Algorithm, Limit, Nanos};
use crate::policy::parse_period;
use crate::service::{CheckItem, CheckRequest, InlineLimit, LimitRef};
use serde_json::{Map, Value};

/// Longest limit name accepted (names come from the policy file; this only bounds input).
pub const MAX_NAME_LEN: usize = 128;
/// Longest request id accepted.
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Longest period text accepted (`"1h 30m"`).
const MAX_PERIOD_TEXT: usize = 64;

/// The input bounds of the node's configuration that apply to one check.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_key_len: usize,
    pub max_items: usize,
}

impl Bounds {
    pub fn of(config: &NodeConfig) -> Self {
        Bounds {
            max_key_len: config.max_key_len,
            max_items: config.max_items,
        }
    }
}

const EXAMPLE: &str = r#"{"checks": [{"limit": "login", "key": "alice", "cost": 1}]}"#;

/// Parses and validates a `/v1/check` body.
pub fn parse_check_body(body: &[u8], bounds: &Bounds) -> Result<CheckRequest, Reject> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Reject::bad(
            "empty_body",
            format!("the body is empty; send a JSON object such as {EXAMPLE}"),
        ));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Reject::bad(
            "malformed_json",
            format!("the body is not valid JSON ({e}); send a JSON object such as {EXAMPLE}"),
        )
    })?;
    let Value::Object(top) = value else {
        return Err(Reject::bad(
            "invalid_field",
            format!(
                "the body is a JSON {}, not an object; send {EXAMPLE}",
                type_name(&value)
            ),
        ));
    };
    let request_id = request_id(top.get("request_id"))?;
    let items = if let Some(checks) = top.get("checks") {
        only_fields(&top, "the body", &["checks", "request_id"])?;
        let Value::Array(checks) = checks else {
            return Err(wrong_type("checks", "a list of checks", checks));
        };
        if checks.is_empty() {
            return Err(Reject::bad(
                "missing_field",
                format!("`checks` is empty; send at least one check, as in {EXAMPLE}"),
            ));
        }
        if checks.len() > bounds.max_items {
            return Err(Reject::bad(
                "too_many_items",
                format!(
                    "`checks` has {} checks; at most {} are accepted in one request; split them \
                     (all-or-nothing holds within one request only)",
                    checks.len(),
                    bounds.max_items
                ),
            ));
        }
        checks
            .iter()
            .enumerate()
            .map(|(n, c)| check_item(c, &format!("checks[{n}]"), bounds))
            .collect::<Result<Vec<_>, _>>()?
    } else if top.contains_key("limit") || top.contains_key("key") {
        only_fields(&top, "the body", &["limit", "key", "cost", "request_id"])?;
        vec![item_fields(&top, "", bounds)?]
    } else {
        only_fields(&top, "the body", &["checks", "request_id"])?;
        return Err(Reject::bad(
            "missing_field",
            format!(
                "the body has no `checks`; send {EXAMPLE}, or one check as \
                 {{\"limit\": \"login\", \"key\": \"alice\"}}"
            ),
        ));
    };
    Ok(CheckRequest { items, request_id })
}

/// `prefix.field`, or `field` for the single-check form.
fn path(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_string()
    } else {
        format!("{prefix}.{field}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

fn wrong_type(path: &str, expected: &str, got: &Value) -> Reject {
    Reject::bad(
        "invalid_field",
        format!("`{path}` must be {expected}, not a {}", type_name(got)),
    )
}

fn missing(path: &str, what: &str) -> Reject {
    Reject::bad("missing_field", format!("`{path}` is missing; {what}"))
}

/// Refuses fields other than `known`.
fn only_fields(obj: &Map<String, Value>, what: &str, known: &[&str]) -> Result<(), Reject> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(Reject::bad(
            "unknown_field",
            format!(
                "{what} has an unknown field {}; the known fields are: {}",
                quote(k),
                known.join(", ")
            ),
        )),
    }
}

fn check_item(v: &Value, prefix: &str, bounds: &Bounds) -> Result<CheckItem, Reject> {
    let Value::Object(obj) = v else {
        return Err(wrong_type(
            prefix,
            r#"an object such as {"limit": "login", "key": "alice"}"#,
            v,
        ));
    };
    only_fields(obj, &format!("`{prefix}`"), &["limit", "key", "cost"])?;
    item_fields(obj, prefix, bounds)
}

fn item_fields(
    obj: &Map<String, Value>,
    prefix: &str,
    bounds: &Bounds,
) -> Result<CheckItem, Reject> {
    let limit_path = path(prefix, "limit");
    let limit = match obj.get("limit") {
        None | Some(Value::Null) => {
            return Err(missing(
                &limit_path,
                "name a limit of the policy file (\"login\") or give one inline \
                 ({\"algorithm\": \"token_bucket\", \"limit\": 10, \"period\": \"1s\"})",
            ))
        }
        Some(Value::String(name)) => LimitRef::Named(limit_name(name, &limit_path)?),
        Some(Value::Object(inline)) => LimitRef::Inline(inline_limit(inline, &limit_path)?),
        Some(other) => {
            return Err(wrong_type(
                &limit_path,
                "a limit name (string) or an inline limit (object)",
                other,
            ))
        }
    };
    let key_path = path(prefix, "key");
    let key = match obj.get("key") {
        None | Some(Value::Null) => {
            return Err(missing(
                &key_path,
                "send the caller's identifier (account, IP, API key)",
            ))
        }
        Some(Value::String(k)) => key(k, &key_path, bounds)?,
        Some(other) => return Err(wrong_type(&key_path, "a string", other)),
    };
    let cost = match obj.get("cost") {
        None | Some(Value::Null) => 1,
        Some(v) => unsigned(v, &path(prefix, "cost"), "the units to spend (0 peeks)")?,
    };
    Ok(CheckItem { limit, key, cost })
}

/// A limit name: non-empty and bounded.
pub fn limit_name(name: &str, path: &str) -> Result<String, Reject> {
    if name.is_empty() {
        return Err(Reject::bad(
            "invalid_field",
            format!("`{path}` is empty; name a limit of the policy file"),
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Reject::bad(
            "invalid_field",
            format!(
                "`{path}` is {} bytes; limit names are at most {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    Ok(name.to_string())
}

/// A key: non-empty and at most `max_key_len` bytes.
pub fn key(k: &str, path: &str, bounds: &Bounds) -> Result<String, Reject> {
    if k.is_empty() {
        return Err(Reject::bad(
            "empty_key",
            format!("`{path}` is empty; send the caller's identifier (account, IP, API key)"),
        ));
    }
    if k.len() > bounds.max_key_len {
        return Err(Reject::bad(
            "key_too_long",
            format!(
                "`{path}` is {} bytes; at most {} are accepted; send a hash of longer keys \
                 (e.g. SHA-256 in hex)",
                k.len(),
                bounds.max_key_len
            ),
        ));
    }
    Ok(k.to_string())
}

/// A whole number from 0 to `u64::MAX`.
fn unsigned(v: &Value, path: &str, what: &str) -> Result<u64, Reject> {
    let Value::Number(n) = v else {
        return Err(wrong_type(path, &format!("a whole number: {what}"), v));
    };
    n.as_u64().ok_or_else(|| {
        let text = n.to_string();
        let why = if n.is_i64() {
            "is negative"
        } else {
            "is fractional or too large"
        };
        Reject::bad(
            "invalid_field",
            format!(
                "`{path}` = {} {why}; send a whole number from 0 to {}: {what}",
                quote(&text),
                u64::MAX
            ),
        )
    })
}

fn request_id(v: Option<&Value>) -> Result<Option<String>, Reject> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) if id.is_empty() => Err(Reject::bad(
            "invalid_field",
            "`request_id` is empty; omit it or send a unique id per logical request",
        )),
        Some(Value::String(id)) if id.len() > MAX_REQUEST_ID_LEN => Err(Reject::bad(
            "invalid_field",
            format!(
                "`request_id` is {} bytes; at most {MAX_REQUEST_ID_LEN} are accepted",
                id.len()
            ),
        )),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(other) => Err(wrong_type("request_id", "a string", other)),
    }
}

fn inline_limit(obj: &Map<String, Value>, prefix: &str) -> Result<InlineLimit, Reject> {
    only_fields(
        obj,
        &format!("`{prefix}`"),
        &["algorithm", "limit", "period", "period_ns", "burst"],
    )?;
    let algorithm = match obj.get("algorithm") {
        None | Some(Value::Null) => {
            let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            return Err(missing(
                &path(prefix, "algorithm"),
                &format!("use one of: {}", names.join(", ")),
            ));
        }
        Some(Value::String(name)) => Algorithm::from_name(name).map_err(|_| {
            let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            Reject::bad(
                "invalid_field",
                format!(
                    "`{}` = {} is not an algorithm; use one of: {}",
                    path(prefix, "algorithm"),
                    quote(name),
                    names.join(", ")
                ),
            )
        })?,
        Some(other) => return Err(wrong_type(&path(prefix, "algorithm"), "a string", other)),
    };
    let limit = match obj.get("limit") {
        None | Some(Value::Null) => {
            return Err(missing(
                &path(prefix, "limit"),
                "send the units per period (the rate of the bucket algorithms)",
            ))
        }
        Some(v) => unsigned(v, &path(prefix, "limit"), "the units per period")?,
    };
    let period_ns = period(obj, prefix)?;
    let burst = match obj.get("burst") {
        None | Some(Value::Null) => None,
        Some(v) => Some(unsigned(
            v,
            &path(prefix, "burst"),
            "the capacity of the bucket algorithms",
        )?),
    };
    Limit::new(algorithm, limit, period_ns, burst.unwrap_or(limit))
        .map_err(|e| Reject::bad("invalid_field", format!("`{prefix}`: {e}")))?;
    Ok(InlineLimit {
        algorithm,
        limit,
        period_ns,
        burst,
    })
}

/// `period` (a duration such as `"1s"`) or `period_ns` (integer nanoseconds), exactly one.
fn period(obj: &Map<String, Value>, prefix: &str) -> Result<Nanos, Reject> {
    let text = obj.get("period").filter(|v| !v.is_null());
    let ns = obj.get("period_ns").filter(|v| !v.is_null());
    match (text, ns) {
        (Some(_), Some(_)) => Err(Reject::bad(
            "invalid_field",
            format!("`{prefix}` has both `period` and `period_ns`; send one of them"),
        )),
        (None, None) => Err(missing(
            &path(prefix, "period"),
            "send `period` as a duration (\"1s\", \"500ms\", \"15m\") or `period_ns` in \
             nanoseconds",
        )),
        (Some(Value::String(t)), None) if t.len() > MAX_PERIOD_TEXT => Err(Reject::bad(
            "invalid_field",
            format!(
                "`{}` is {} bytes long; write a duration such as \"1s\", \"500ms\", \"15m\"",
                path(prefix, "period"),
                t.len()
            ),
        )),
        (Some(Value::String(t)), None) => {
            parse_period(t).map_err(|e| Reject::bad("invalid_field", format!("`{prefix}`: {e}")))
        }
        (Some(other), None) => Err(wrong_type(
            &path(prefix, "period"),
            "a duration string such as \"1s\" (or send `period_ns` as a number)",
            other,
        )),
        (None, Some(v)) => unsigned(v, &path(prefix, "period_ns"), "the period in nanoseconds"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::SECOND;

    const B: Bounds = Bounds {
        max_key_len: 8,
        max_items: 2,
    };

    fn parse(text: &str) -> Result<CheckRequest, Reject> {
        parse_check_body(text.as_bytes(), &B)
    }

    fn refused(text: &str) -> (&'static str, String) {
        let r = parse(text).expect_err(text);
        assert_eq!(r.status, axum::http::StatusCode::BAD_REQUEST);
        (r.reason, r.message)
    }

    #[test]
    fn a_list_of_named_and_inline_checks_parses() {
        let req = parse(
            r#"{"checks": [{"limit": "login", "key": "alice", "cost": 2},
                {"limit": {"algorithm": "token_bucket", "limit": 10, "period": "1s", "burst": 20},
                 "key": "x"}], "request_id": "r1"}"#,
        )
        .unwrap();
        assert_eq!(req.request_id.as_deref(), Some("r1"));
        assert_eq!(req.items[0].limit, LimitRef::Named("login".into()));
        assert_eq!(req.items[0].cost, 2);
        assert_eq!(
            req.items[1].limit,
            LimitRef::Inline(InlineLimit {
                algorithm: Algorithm::TokenBucket,
                limit: 10,
                period_ns: SECOND,
                burst: Some(20),
            })
        );
        assert_eq!(req.items[1].cost, 1);
    }

    #[test]
    fn a_single_check_object_is_accepted() {
        let req = parse(r#"{"limit": "login", "key": "bob", "request_id": "z"}"#).unwrap();
        assert_eq!(req.items.len(), 1);
        assert_eq!(req.items[0].key, "bob");
        assert_eq!(req.request_id.as_deref(), Some("z"));
    }

    #[test]
    fn the_period_may_be_given_in_nanoseconds() {
        let req = parse(
            r#"{"limit": {"algorithm": "gcra", "limit": 3, "period_ns": 250000000}, "key": "k"}"#,
        )
        .unwrap();
        let LimitRef::Inline(l) = &req.items[0].limit else {
            panic!("inline")
        };
        assert_eq!((l.period_ns, l.burst), (250_000_000, None));
    }

    #[test]
    fn malformed_json_and_non_objects_are_refused() {
        assert_eq!(refused(r#"{"checks": ["#).0, "malformed_json");
        assert_eq!(refused("").0, "empty_body");
        assert_eq!(refused("[1]").0, "invalid_field");
        assert_eq!(refused(&"[".repeat(10_000)).0, "malformed_json");
    }

    #[test]
    fn a_missing_field_is_named() {
        let (reason, msg) = refused(r#"{"checks": [{"limit": "login"}]}"#);
        assert_eq!(reason, "missing_field");
        assert!(msg.contains("`checks[0].key`"), "{msg}");
        let (_, msg) = refused(r#"{"key": "a"}"#);
        assert!(msg.contains("`limit`"), "{msg}");
        let (_, msg) = refused(r#"{}"#);
        assert!(msg.contains("`checks`"), "{msg}");
    }

    #[test]
    fn a_wrong_type_is_named_with_what_was_expected() {
        let (reason, msg) = refused(r#"{"checks": [{"limit": "a", "key": 5}]}"#);
        assert_eq!(reason, "invalid_field");
        assert!(
            msg.contains("`checks[0].key` must be a string, not a number"),
            "{msg}"
        );
        let (_, msg) = refused(r#"{"checks": {"limit": "a"}}"#);
        assert!(msg.contains("`checks` must be a list"), "{msg}");
        let (_, msg) = refused(r#"{"limit": ["a"], "key": "k"}"#);
        assert!(msg.contains("`limit`"), "{msg}");
    }

    #[test]
    fn keys_must_be_non_empty_and_bounded() {
        assert_eq!(refused(r#"{"limit": "a", "key": ""}"#).0, "empty_key");
        let (reason, msg) = refused(r#"{"limit": "a", "key": "123456789"}"#);
        assert_eq!(reason, "key_too_long");
        assert!(
            msg.contains("9 bytes") && msg.contains("at most 8"),
            "{msg}"
        );
        assert!(parse(r#"{"limit": "a", "key": "12345678"}"#).is_ok());
    }

    #[test]
    fn costs_that_do_not_fit_u64_are_refused() {
        for bad in ["-1", "1.5", "18446744073709551616", "1e30", "\"3\"", "true"] {
            let text = format!(r#"{{"limit": "a", "key": "k", "cost": {bad}}}"#);
            let (reason, msg) = refused(&text);
            assert_eq!(reason, "invalid_field", "{bad}");
            assert!(msg.contains("`cost`"), "{bad}: {msg}");
        }
        let max = format!(r#"{{"limit": "a", "key": "k", "cost": {}}}"#, u64::MAX);
        assert_eq!(parse(&max).unwrap().items[0].cost, u64::MAX);
    }

    #[test]
    fn too_many_or_no_checks_are_refused() {
        let three = r#"{"checks": [{"limit": "a", "key": "k"}, {"limit": "a", "key": "k"},
            {"limit": "a", "key": "k"}]}"#;
        assert_eq!(refused(three).0, "too_many_items");
        assert_eq!(refused(r#"{"checks": []}"#).0, "missing_field");
    }

    #[test]
    fn unknown_fields_are_refused_so_typos_are_not_defaults() {
        let (reason, msg) = refused(r#"{"limit": "a", "key": "k", "cots": 5}"#);
        assert_eq!(reason, "unknown_field");
        assert!(msg.contains("cots") && msg.contains("cost"), "{msg}");
        let (reason, _) = refused(r#"{"checks": [{"limit": "a", "key": "k", "x": 1}]}"#);
        assert_eq!(reason, "unknown_field");
    }

    #[test]
    fn inline_limits_are_validated_field_by_field() {
        let cases = [
            (
                r#"{"algorithm": "magic", "limit": 1, "period": "1s"}"#,
                "algorithm",
            ),
            (
                r#"{"algorithm": "gcra", "limit": 0, "period": "1s"}"#,
                "`limit`",
            ),
            (
                r#"{"algorithm": "gcra", "limit": 1, "period": "soon"}"#,
                "`period`",
            ),
            (
                r#"{"algorithm": "gcra", "limit": 1, "period": "400d"}"#,
                "366 days",
            ),
            (r#"{"algorithm": "gcra", "limit": 1}"#, "`limit.period`"),
            (
                r#"{"algorithm": "gcra", "limit": 1, "period": "1s", "period_ns": 5}"#,
                "both",
            ),
            (
                r#"{"algorithm": "gcra", "limit": 1, "period_ns": 0}"#,
                "1ns",
            ),
            (
                r#"{"algorithm": "gcra", "limit": 1, "period": "1s", "burst": 0}"#,
                "`burst`",
            ),
        ];
        for (inline, needle) in cases {
            let text = format!(r#"{{"limit": {inline}, "key": "k"}}"#);
            let (_, msg) = refused(&text);
            assert!(msg.contains(needle), "{inline}: {msg}");
        }
    }

    #[test]
    fn request_ids_are_bounded_strings() {
        let long = format!(
            r#"{{"limit": "a", "key": "k", "request_id": "{}"}}"#,
            "x".repeat(200)
        );
        assert_eq!(refused(&long).0, "invalid_field");
        assert_eq!(
            refused(r#"{"limit": "a", "key": "k", "request_id": 7}"#).0,
            "invalid_field"
        );
    }
}
