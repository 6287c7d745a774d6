//! `/v1/authorize`: the check for gateways (Traefik ForwardAuth, nginx `auth_request`), which
//! can only send a URL and the original request's headers and only read a status.
//!
//! Everything comes from the query string, except that the key may be read from a header
//! of the original request (`key_header=X-Api-Key`), and the denial status is chosen by
//! the caller (`deny_status`), because gateways differ in what they pass through: Traefik
//! returns any non-2xx answer to the client as-is, nginx turns anything but 401/403 into a
//! 500. Parsing is pure, so these rules are unit-tested.
//!
//! A key read from a header is only as trustworthy as the element of it that the caller's
//! own proxy wrote. `X-Forwarded-For` is a list to which each proxy appends the address it
//! saw, after whatever the client sent: its first element is the client's choice, and only
//! the rightmost ones are the proxies' (`key_hops` counts them). Any other header is used
//! whole, and refused when it is a list, given twice, or has spaces, rather than read in a
//! way that would let a client pick a fresh key per request.

use super::reject::{quote, Reject};
use super::request::{key, limit_name, Bounds};
use crate::service::{CheckItem, CheckRequest, LimitRef};
use axum::http::{HeaderMap, HeaderName, StatusCode};

/// Most query parameters accepted.
const MAX_PARAMS: usize = 8;
/// Longest header name accepted for `key_header`.
const MAX_HEADER_NAME: usize = 64;
/// Most proxies `key_hops` may count: chains are a few proxies long; this only bounds input.
const MAX_HOPS: usize = 16;
/// The list header whose rightmost elements the caller's proxies wrote.
const FORWARDED_FOR: &str = "x-forwarded-for";
const KNOWN: &str = "limit, key, key_header, key_hops, cost, deny_status";

/// A parsed `/v1/authorize` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorize {
    pub request: CheckRequest,
    /// The status of a denial: 429 (default), 403 or 401.
    pub deny_status: StatusCode,
}

/// Refuses a raw query string with a `%` not followed by two hex digits, or whose escapes
/// do not decode to UTF-8. The form decoder behind the parameters keeps such text as it is
/// (`key=%ZZ` would be the key `%ZZ`) or replaces it (`%FF` with U+FFFD), so a mistaken
/// escape would silently become another key.
pub fn check_escapes(raw: Option<&str>) -> Result<(), Reject> {
    let Some(raw) = raw else { return Ok(()) };
    let raw = raw.as_bytes();
    let mut decoded = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'%' {
            decoded.push(raw[i]);
            i += 1;
            continue;
        }
        let Some(byte) = crate::api::hex_pair(raw, i + 1) else {
            return Err(Reject::bad(
                "bad_query",
                "the query has a `%` not followed by two hex digits; write `%` itself as %25 \
                 and escape other bytes as %XX",
            ));
        };
        decoded.push(byte);
        i += 3;
    }
    match std::str::from_utf8(&decoded) {
        Ok(_) => Ok(()),
        Err(_) => Err(Reject::bad(
            "bad_query",
            "the query's %-escapes do not decode to UTF-8; escape a key's UTF-8 bytes",
        )),
    }
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
    let mut key_hops = None;
    let mut cost = None;
    let mut deny = None;
    for (name, value) in params {
        let slot = match name.as_str() {
            "limit" => &mut limit,
            "key" => &mut key_value,
            "key_header" => &mut key_header,
            "key_hops" => &mut key_hops,
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
            (None, Some(h)) => key_from_header(h, key_hops, headers, bounds)?,
            (None, None) => return Err(Reject::bad(
                "missing_field",
                "the key is missing; give `key=...`, or `key_header=X-Api-Key` to read it from \
                 a header of the request",
            )),
        };
    if let (Some(_), None) = (key_hops, key_header) {
        return Err(Reject::bad(
            "bad_query",
            "`key_hops` is given without `key_header=X-Forwarded-For`; give both, or neither",
        ));
    }
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

/// A whole number in decimal digits only (`u64::from_str` also takes a leading `+`), if it
/// fits.
fn digits(text: &str) -> Option<u64> {
    let all_digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    text.parse().ok().filter(|_| all_digits)
}

fn parse_cost(text: &str) -> Result<u64, Reject> {
    match digits(text) {
        Some(c) => Ok(c),
        None => Err(Reject::bad(
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

/// The key in the header `name`: of `X-Forwarded-For`, the `hops`-th element from the
/// right (default 1); of any other header, its one value. Trimmed either way, and refused
/// unless it is visible ASCII without spaces.
fn key_from_header(
    name: &str,
    hops: Option<&str>,
    headers: &HeaderMap,
    bounds: &Bounds,
) -> Result<String, Reject> {
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
    let is_list = header == FORWARDED_FOR;
    let hops = match hops {
        None => 1,
        Some(_) if !is_list => {
            return Err(Reject::bad(
                "bad_query",
                format!(
                    "`key_hops` counts the proxies of X-Forwarded-For, not of `{header}`; \
                     drop it, or use key_header=X-Forwarded-For"
                ),
            ))
        }
        Some(h) => parse_hops(h)?,
    };
    let values = headers
        .get_all(&header)
        .iter()
        .map(|v| {
            v.to_str().map_err(|_| {
                Reject::bad(
                    "invalid_field",
                    format!("the `{header}` header is not visible ASCII; send the key as ASCII"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let value = match values.as_slice() {
        [] => {
            return Err(Reject::bad(
                "missing_key_header",
                format!(
                    "the request has no `{header}` header (named by key_header); send it with \
                     the key (some clients, curl among them, leave out a header whose value is \
                     blank)"
                ),
            ))
        }
        // Lines of one header are one list, in order (RFC 9110, 5.3): a proxy may add its
        // own line after the client's instead of appending to it.
        _ if is_list => {
            let mut elements = values
                .iter()
                .rev()
                .flat_map(|v| v.rsplit(','))
                .map(str::trim)
                .filter(|e| !e.is_empty());
            match elements.nth(hops - 1) {
                Some(e) => e,
                None if hops == 1 => return Err(empty(&header)),
                None => {
                    return Err(Reject::bad(
                        "missing_key_header",
                        format!(
                            "the `{header}` header has fewer than {hops} addresses, so \
                             key_hops={hops} finds none; check that requests come through the \
                             {hops} proxies it counts"
                        ),
                    ))
                }
            }
        }
        [one] => {
            let one = one.trim();
            if one.is_empty() {
                return Err(empty(&header));
            }
            if one.contains(',') {
                return Err(Reject::bad(
                    "invalid_field",
                    format!(
                        "the `{header}` header holds a list ({}); its elements may come from \
                         different senders, so a list is read only from X-Forwarded-For (its \
                         rightmost element); send one value",
                        quote(one)
                    ),
                ));
            }
            one
        }
        many => {
            return Err(Reject::bad(
                "invalid_field",
                format!(
                    "the request has the `{header}` header {} times; send it once, as which \
                     one to trust is known only for X-Forwarded-For",
                    many.len()
                ),
            ))
        }
    };
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Reject::bad(
            "invalid_field",
            format!(
                "the key in the `{header}` header, {}, has a space or tab; a key from a header \
                 is visible ASCII without spaces",
                quote(value)
            ),
        ));
    }
    key(value, &format!("{header} header"), bounds)
}

/// The refusal of a header whose value is blank.
fn empty(header: &HeaderName) -> Reject {
    Reject::bad(
        "empty_key",
        format!(
            "the `{header}` header (named by key_header) is empty; send the caller's identifier \
             in it"
        ),
    )
}

fn parse_hops(text: &str) -> Result<usize, Reject> {
    match digits(text).and_then(|n| usize::try_from(n).ok()) {
        Some(n) if (1..=MAX_HOPS).contains(&n) => Ok(n),
        _ => Err(Reject::bad(
            "bad_query",
            format!(
                "`key_hops` = {} is not a whole number from 1 to {MAX_HOPS}; give how many \
                 proxies you run in front of quorate, counting the one that calls it (default \
                 1)",
                quote(text)
            ),
        )),
    }
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

    fn from_headers(
        pairs: &[(&str, &str)],
        lines: &[(&'static str, &str)],
    ) -> Result<String, Reject> {
        let mut h = HeaderMap::new();
        for (name, value) in lines {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        let bounds = Bounds {
            max_key_len: 64,
            max_items: 4,
        };
        let a = parse_authorize(&q(pairs), &h, &bounds)?;
        Ok(a.request.items[0].key.clone())
    }

    const XFF: (&str, &str) = ("key_header", "X-Forwarded-For");

    #[test]
    fn forwarded_for_gives_the_rightmost_address_whatever_the_client_put_first() {
        let limit = ("limit", "api");
        for client_part in ["10.0.0.1", "10.0.0.2, 10.0.0.3", "", " ,"] {
            let value = format!("{client_part}, 203.0.113.9");
            let k = from_headers(&[limit, XFF], &[("x-forwarded-for", &value)]);
            assert_eq!(k.unwrap(), "203.0.113.9", "{value:?}");
        }
        // A proxy may add its own line instead of appending: the lines are one list.
        let lines = [
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "203.0.113.9 , "),
        ];
        assert_eq!(from_headers(&[limit, XFF], &lines).unwrap(), "203.0.113.9");
        let one = [("x-forwarded-for", "2001:db8::1")];
        assert_eq!(from_headers(&[limit, XFF], &one).unwrap(), "2001:db8::1");
    }

    #[test]
    fn key_hops_counts_the_proxies_from_the_right() {
        let xff = [("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.1.1")];
        let hops = |n| from_headers(&[("limit", "api"), XFF, ("key_hops", n)], &xff);
        assert_eq!(hops("1").unwrap(), "10.1.1.1");
        assert_eq!(hops("2").unwrap(), "198.51.100.7");
        assert_eq!(hops("4").unwrap_err().reason, "missing_key_header");
        for bad in ["0", "17", "+2", "x", ""] {
            assert_eq!(hops(bad).unwrap_err().reason, "bad_query", "{bad}");
        }
        let other = [("x-api-key", "k")];
        let r = from_headers(
            &[
                ("limit", "api"),
                ("key_header", "X-Api-Key"),
                ("key_hops", "1"),
            ],
            &other,
        );
        assert_eq!(r.unwrap_err().reason, "bad_query");
        let r = from_headers(&[("limit", "api"), ("key", "k"), ("key_hops", "1")], &[]);
        assert_eq!(r.unwrap_err().reason, "bad_query");
    }

    #[test]
    fn a_header_that_is_a_list_repeated_or_spaced_is_refused_not_used_whole() {
        let api = [("limit", "api"), ("key_header", "X-Api-Key")];
        let cases: [&[(&str, &str)]; 4] = [
            &[("x-api-key", "a,b")],
            &[("x-api-key", "Bearer abc")],
            &[("x-api-key", "a\tb")],
            &[("x-api-key", "a"), ("x-api-key", "b")],
        ];
        for lines in cases {
            let r = from_headers(&api, lines).unwrap_err();
            assert_eq!(r.reason, "invalid_field", "{lines:?}");
        }
        let r = from_headers(
            &[("limit", "api"), XFF],
            &[("x-forwarded-for", "1.2.3.4 5")],
        );
        assert_eq!(r.unwrap_err().reason, "invalid_field");
        let key = from_headers(&api, &[("x-api-key", "  tok-EN_1/+=  ")]);
        assert_eq!(key.unwrap(), "tok-EN_1/+=");
    }

    #[test]
    fn a_blank_key_header_is_called_empty_not_missing() {
        for (header, lines) in [
            ("X-Api-Key", [("x-api-key", "   ")]),
            ("X-Forwarded-For", [("x-forwarded-for", " , ,")]),
        ] {
            let r = from_headers(&[("limit", "api"), ("key_header", header)], &lines);
            let r = r.unwrap_err();
            assert_eq!(r.reason, "empty_key", "{header}");
            assert!(
                r.message.contains("header (named by key_header) is empty"),
                "{}",
                r.message
            );
        }
        let r = from_headers(&[("limit", "api"), ("key_header", "X-Api-Key")], &[]).unwrap_err();
        assert_eq!(r.reason, "missing_key_header");
        assert!(r
            .message
            .starts_with("the request has no `x-api-key` header"));
    }

    #[test]
    fn a_query_with_a_broken_escape_is_refused() {
        assert!(check_escapes(None).is_ok());
        for good in ["limit=api&key=a%20b", "key=%E2%82%AC", "key=%7e", "key=a+b"] {
            assert!(check_escapes(Some(good)).is_ok(), "{good}");
        }
        for bad in ["key=%ZZ", "key=%", "key=a%2", "key=%FF", "key=%C3"] {
            let r = check_escapes(Some(bad)).unwrap_err();
            assert_eq!(r.reason, "bad_query", "{bad}");
        }
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
