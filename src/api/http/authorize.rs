//! `/v1/authorize`: the check for gateways (Traefik ForwardAuth, nginx `auth_request`), which
//! can only send a URL and the original request's headers and only read a status.
//!
//! Everything comes from the query string, except that the key may be read from a header
//! of the original request (`key_header=X-Api-Key`), and the denial status is chosen by
//! the caller (`deny_status`), because gateways differ in what they pass through: Traefik
//! returns any non-2xx answer to the client as-is, nginx turns anything but 401/403 into a
//! 500. Parsing is pure, so these rules are unit-tested.

use super::reject::{quote, Reject};
use super::request::{key, limit_name, Bounds};
use crate::service::{CheckItem, CheckRequest, LimitRef};
use axum::http::{HeaderMap, HeaderName, StatusCode};

/// Most query parameters accepted.
const MAX_PARAMS: usize = 8;
/// Longest header name accepted for `key_header`.
const MAX_HEADER_NAME: usize = 64;
const KNOWN: &str = "limit, key, key_header, cost, deny_status";

/// A parsed `/v1/authorize` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorize {
    pub request: CheckRequest,
    /// The status of a denial: 429 (default), 403 or 401.
    pub deny_status: StatusCode,
}

/// Parses the query parameters (already percent-decoded) and the request's headers.
pub fn parse_authorize(
    params: &[(String, String)],
    headers: &HeaderMap,
    bounds: &Bounds,
) -> Result<Authorize, Reject> {
    if params.len() > MAX_PARAMS {
        return Err(Reject::bad(
            "bad_query",
            format!(
                "the query has {} parameters; at most {MAX_PARAMS} are accepted ({KNOWN})",
                params.len()
            ),
        ));
    }
    let mut limit = None;
    let mut key_value = None;
    let mut key_header = None;
    let mut cost = None;
    let mut deny = None;
    for (name, value) in params {
        let slot = match name.as_str() {
            "limit" => &mut limit,
            "key" => &mut key_value,
            "key_header" => &mut key_header,
            "cost" => &mut cost,
            "deny_status" => &mut deny,
            _ => {
                return Err(Reject::bad(
                    "bad_query",
                    format!(
                        "unknown query parameter {}; the known ones are: {KNOWN}",
                        quote(name)
                    ),
                ))
            }
        };
        if slot.replace(value.as_str()).is_some() {
            return Err(Reject::bad(
                "bad_query",
                format!("`{name}` is given twice; give it once"),
            ));
        }
    }
    let limit = match limit {
        Some(l) => limit_name(l, "limit")?,
        None => {
            return Err(Reject::bad(
                "missing_field",
                "`limit` is missing; name a limit of the policy file: ?limit=api&key=...",
            ))
        }
    };
    let key =
        match (key_value, key_header) {
            (Some(_), Some(_)) => {
                return Err(Reject::bad(
                    "bad_query",
                    "both `key` and `key_header` are given; give one of them",
                ))
            }
            (Some(k), None) => key(k, "key", bounds)?,
            (None, Some(h)) => key_from_header(h, headers, bounds)?,
            (None, None) => return Err(Reject::bad(
                "missing_field",
                "the key is missing; give `key=...`, or `key_header=X-Api-Key` to read it from \
                 a header of the request",
            )),
        };
    let cost = match cost {
        None => 1,
        Some(c) => parse_cost(c)?,
    };
    let deny_status = match deny {
        None => StatusCode::TOO_MANY_REQUESTS,
        Some("429") => StatusCode::TOO_MANY_REQUESTS,
        Some("403") => StatusCode::FORBIDDEN,
        Some("401") => StatusCode::UNAUTHORIZED,
        Some(other) => {
            return Err(Reject::bad(
                "bad_query",
                format!(
                    "`deny_status` = {} is not allowed; use 429 (Traefik, clients), 403 or 401 \
                     (nginx auth_request)",
                    quote(other)
                ),
            ))
        }
    };
    Ok(Authorize {
        request: CheckRequest {
            items: vec![CheckItem {
                limit: LimitRef::Named(limit),
                key,
                cost,
            }],
            request_id: None,
        },
        deny_status,
    })
}

fn parse_cost(text: &str) -> Result<u64, Reject> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    match text.parse::<u64>() {
        Ok(c) if digits => Ok(c),
        _ => Err(Reject::bad(
            "invalid_field",
            format!(
                "`cost` = {} is not a whole number from 0 to {}; send the units to spend (0 \
                 peeks)",
                quote(text),
                u64::MAX
            ),
        )),
    }
}

fn key_from_header(name: &str, headers: &HeaderMap, bounds: &Bounds) -> Result<String, Reject> {
    let header = (name.len() <= MAX_HEADER_NAME)
        .then(|| HeaderName::from_bytes(name.as_bytes()).ok())
        .flatten()
        .ok_or_else(|| {
            Reject::bad(
                "bad_query",
                format!(
                    "`key_header` = {} is not a header name (at most {MAX_HEADER_NAME} bytes of \
                     letters, digits and -)",
                    quote(name)
                ),
            )
        })?;
    let Some(value) = headers.get(&header) else {
        return Err(Reject::bad(
            "missing_key_header",
            format!("the request has no `{header}` header (named by key_header); send it"),
        ));
    };
    let text = value.to_str().map_err(|_| {
        Reject::bad(
            "invalid_field",
            format!("the `{header}` header is not visible ASCII; send the key as ASCII"),
        )
    })?;
    key(text.trim(), &format!("{header} header"), bounds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const B: Bounds = Bounds {
        max_key_len: 8,
        max_items: 4,
    };

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<Authorize, Reject> {
        parse_authorize(&q(pairs), &HeaderMap::new(), &B)
    }

    #[test]
    fn limit_and_key_make_one_check_denied_with_429_by_default() {
        let a = parse(&[("limit", "api"), ("key", "k1")]).unwrap();
        assert_eq!(a.deny_status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(a.request.items[0].key, "k1");
        assert_eq!(a.request.items[0].cost, 1);
        assert_eq!(a.request.items[0].limit, LimitRef::Named("api".into()));
    }

    #[test]
    fn deny_status_may_be_401_403_or_429_only() {
        let a = parse(&[("limit", "api"), ("key", "k"), ("deny_status", "403")]).unwrap();
        assert_eq!(a.deny_status, StatusCode::FORBIDDEN);
        let a = parse(&[("limit", "api"), ("key", "k"), ("deny_status", "401")]).unwrap();
        assert_eq!(a.deny_status, StatusCode::UNAUTHORIZED);
        for bad in ["500", "200", "abc", ""] {
            let r = parse(&[("limit", "api"), ("key", "k"), ("deny_status", bad)]);
            assert_eq!(r.unwrap_err().reason, "bad_query", "{bad}");
        }
    }

    #[test]
    fn the_key_may_come_from_a_named_header() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("secret"));
        let a = parse_authorize(&q(&[("limit", "api"), ("key_header", "X-Api-Key")]), &h, &B);
        assert_eq!(a.unwrap().request.items[0].key, "secret");
        let r = parse_authorize(&q(&[("limit", "api"), ("key_header", "X-Other")]), &h, &B);
        assert_eq!(r.unwrap_err().reason, "missing_key_header");
        let r = parse_authorize(&q(&[("limit", "api"), ("key_header", "bad name")]), &h, &B);
        assert_eq!(r.unwrap_err().reason, "bad_query");
        h.insert("x-long", HeaderValue::from_static("123456789"));
        let r = parse_authorize(&q(&[("limit", "api"), ("key_header", "x-long")]), &h, &B);
        assert_eq!(r.unwrap_err().reason, "key_too_long");
    }

    #[test]
    fn hostile_queries_are_refused_with_the_fix() {
        let cases: [&[(&str, &str)]; 8] = [
            &[("key", "k")],
            &[("limit", "api")],
            &[("limit", "api"), ("key", "")],
            &[("limit", "api"), ("key", "k"), ("key_header", "x")],
            &[("limit", "api"), ("key", "k"), ("cost", "-1")],
            &[
                ("limit", "api"),
                ("key", "k"),
                ("cost", "18446744073709551616"),
            ],
            &[("limit", "api"), ("limit", "api"), ("key", "k")],
            &[("limit", "api"), ("key", "k"), ("colour", "blue")],
        ];
        for c in cases {
            let r = parse(c).unwrap_err();
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{c:?}");
        }
        let many: Vec<(&str, &str)> = vec![("cost", "1"); 20];
        assert_eq!(parse(&many).unwrap_err().reason, "bad_query");
    }

    #[test]
    fn cost_accepts_the_whole_u64_range_and_nothing_else() {
        let max = u64::MAX.to_string();
        let a = parse(&[("limit", "api"), ("key", "k"), ("cost", &max)]).unwrap();
        assert_eq!(a.request.items[0].cost, u64::MAX);
        let a = parse(&[("limit", "api"), ("key", "k"), ("cost", "0")]).unwrap();
        assert_eq!(a.request.items[0].cost, 0);
        assert!(parse(&[("limit", "api"), ("key", "k"), ("cost", "+1")]).is_err());
    }
}
