//! The router: which path does what. Handlers only translate — read and validate input,
//! call the [`Service`], render the answer — so the decision rules live in the service and
//! the HTTP rules in the pure `request`, `authorize` and `decision` modules.

use super::authorize::{check_escapes, parse_authorize};
use super::body::read_bounded;
use super::decision::{error_status, render};
use super::reject::{quote, Reject};
use super::request::{parse_check_body, Bounds};
use crate::service::{CheckRequest, Service};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, DATE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::map_response_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use std::time::{Duration, UNIX_EPOCH};

/// The content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

const ROUTES: &str = "POST /v1/check, GET /v1/authorize, GET /metrics, GET /healthz, \
                      GET /readyz, GET /v1/admin/status, POST /v1/admin/reload, \
                      POST /v1/admin/members";

#[derive(Clone)]
struct AppState {
    service: Service,
}

/// The HTTP API of a node as an axum router.
pub fn router(service: Service) -> Router {
    let state = AppState { service };
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/authorize", any(authorize))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/admin/status", get(status))
        .route("/v1/admin/reload", post(reload))
        .route("/v1/admin/members", post(members))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(map_response_with_state(state.clone(), date_header))
        .with_state(state)
}

/// Sets `Date` from the node's clock (hyper's own is turned off), so the API reads wall
/// time through the clock seam like everything else.
async fn date_header(State(st): State<AppState>, mut resp: Response) -> Response {
    let wall = UNIX_EPOCH + Duration::from_nanos(st.service.clock().wall());
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(wall)) {
        resp.headers_mut().insert(DATE, v);
    }
    resp
}

async fn check(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    const ROUTE: &str = "/v1/check";
    let svc = &st.service;
    let cfg = svc.config();
    let parsed = match read_bounded(&headers, body, cfg.max_body_bytes, cfg.idle_timeout).await {
        Ok(bytes) => parse_check_body(&bytes, &Bounds::of(cfg)),
        Err(r) => Err(r),
    };
    match parsed {
        Ok(req) => decide(svc, req, StatusCode::TOO_MANY_REQUESTS, ROUTE).await,
        Err(r) => r.respond(svc, ROUTE),
    }
}

async fn authorize(
    State(st): State<AppState>,
    uri: Uri,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    const ROUTE: &str = "/v1/authorize";
    let svc = &st.service;
    let parsed = match (check_escapes(uri.query()), query) {
        (Err(r), _) => Err(r),
        (Ok(()), Ok(Query(params))) => {
            parse_authorize(&params, &headers, &Bounds::of(svc.config()))
        }
        (Ok(()), Err(e)) => Err(Reject::bad(
            "bad_query",
            format!("the query string cannot be read ({e}); send ?limit=NAME&key=KEY"),
        )),
    };
    match parsed {
        Ok(a) => decide(svc, a.request, a.deny_status, ROUTE).await,
        Err(r) => r.respond(svc, ROUTE),
    }
}

/// Asks the service, times the decision and renders it.
async fn decide(
    svc: &Service,
    req: CheckRequest,
    deny_status: StatusCode,
    route: &str,
) -> Response {
    let clock = svc.clock();
    let start = clock.monotonic();
    let result = svc.check(req).await;
    let elapsed = clock.monotonic().saturating_sub(start);
    svc.metrics()
        .decision_latency
        .with_label_values(&["http"])
        .observe(elapsed as f64 / 1e9);
    match result {
        Ok(resp) => render(&resp, deny_status).into_response(),
        Err(e) => {
            let (status, reason) = error_status(&e);
            Reject::new(status, reason, e.to_string()).respond(svc, route)
        }
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    (
        [(CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        st.service.metrics().render(),
    )
        .into_response()
}

/// `200 ok` while the process can serve; `503` once a shard's Raft group on this member
/// stopped on an error (a failed disk): only a restart brings it back.
async fn healthz(State(st): State<AppState>) -> Response {
    let failed = st.service.failed_shards();
    if failed.is_empty() {
        return (StatusCode::OK, "ok\n").into_response();
    }
    let mut body = format!(
        "failed: the Raft group of {} shard(s) stopped on this member; restart it \
         (docs/operations.md)\n",
        failed.len()
    );
    for (shard, error) in failed.iter().take(8) {
        body.push_str(&format!("shard {shard}: {error}\n"));
    }
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

async fn readyz(State(st): State<AppState>) -> Response {
    if st.service.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// `GET /v1/admin/status`; `?digest=true` adds each shard's state digest (a cost to the
/// shards' applies: see `Service::status_with`), `?lag=true` the lag of the shards other
/// members lead (asked of their leaders, up to a second: see `Cluster::fill_lag`).
async fn status(
    State(st): State<AppState>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    const ROUTE: &str = "/v1/admin/status";
    let bad = |why: String| Reject::bad("bad_query", why).respond(&st.service, ROUTE);
    const PARAMETERS: &str = "the parameters are digest=true (each shard's state digest) and \
                              lag=true (every shard's lag, from its leader), each at most once";
    let Ok(Query(pairs)) = &query else {
        return bad(PARAMETERS.into());
    };
    let (mut digests, mut lags) = (None, None);
    for (name, value) in pairs {
        let slot = match name.as_str() {
            "digest" => &mut digests,
            "lag" => &mut lags,
            _ => return bad(PARAMETERS.into()),
        };
        let flag = match value.as_str() {
            "true" => true,
            "false" => false,
            _ => return bad(format!("{name}={value:?}: {PARAMETERS}")),
        };
        if slot.replace(flag).is_some() {
            return bad(PARAMETERS.into());
        }
    }
    let lags = lags == Some(true);
    if digests != Some(true) {
        let mut status = st.service.status();
        if lags {
            st.service.fill_lag(&mut status).await;
        }
        return Json(status).into_response();
    }
    // Each shard's digest holds its applies while it is computed: one request at a time,
    // off the runtime's workers.
    static DIGESTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let Ok(one) = DIGESTS.acquire().await else {
        unreachable!("the semaphore is never closed")
    };
    let svc = st.service.clone();
    let hashed = tokio::task::spawn_blocking(move || svc.status_with(true)).await;
    drop(one);
    match hashed {
        Ok(mut status) => {
            if lags {
                st.service.fill_lag(&mut status).await;
            }
            Json(status).into_response()
        }
        Err(e) => Reject::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "status_failed",
            format!("the status did not finish ({e})"),
        )
        .respond(&st.service, ROUTE),
    }
}

/// The admin API's changes need the node's `--admin-token`, when it has one, as
/// `Authorization: Bearer <token>`: a refusal (401, counted as `unauthorized`) otherwise.
/// The token is compared by its SHA-256, in constant time: the time taken tells nothing of
/// how much of it a guess got right, nor its length.
fn admin_refusal(st: &AppState, headers: &HeaderMap, route: &str) -> Option<Response> {
    use sha2::{Digest, Sha256};
    let token = st.service.config().admin_token.as_deref()?;
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    if let Some(given) = given {
        let (a, b) = (
            Sha256::digest(given.as_bytes()),
            Sha256::digest(token.as_bytes()),
        );
        if a.iter().zip(b.iter()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0 {
            return None;
        }
    }
    let why = match given {
        None => "this admin endpoint needs the node's admin token: send `Authorization: Bearer <token>` (the node's --admin-token, QUORATE_ADMIN_TOKEN; `quorate members` sends QUORATE_ADMIN_TOKEN)",
        Some(_) => "the bearer token is not this node's admin token (--admin-token, QUORATE_ADMIN_TOKEN)",
    };
    let mut refused =
        Reject::new(StatusCode::UNAUTHORIZED, "unauthorized", why).respond(&st.service, route);
    refused
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(refused)
}

async fn reload(State(st): State<AppState>, headers: HeaderMap) -> Response {
    const ROUTE: &str = "/v1/admin/reload";
    if let Some(refused) = admin_refusal(&st, &headers, ROUTE) {
        return refused;
    }
    let svc = st.service.clone();
    match tokio::task::spawn_blocking(move || svc.reload()).await {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err(e)) => Reject::bad("reload_failed", e).respond(&st.service, ROUTE),
        Err(e) => Reject::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "reload_failed",
            format!("the reload did not finish ({e}); the old policies stay in force"),
        )
        .respond(&st.service, ROUTE),
    }
}

/// `POST /v1/admin/members`: `{"add": {"id": 4, "addr": "10.0.0.4:7100"}}` or
/// `{"remove": {"id": 4}}`. Answers once every shard's group has the change committed.
async fn members(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    const ROUTE: &str = "/v1/admin/members";
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Add {
        id: u64,
        addr: String,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Remove {
        id: u64,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Change {
        add: Option<Add>,
        remove: Option<Remove>,
    }
    if let Some(refused) = admin_refusal(&st, &headers, ROUTE) {
        return refused;
    }
    let svc = &st.service;
    let cfg = svc.config();
    let bytes = match read_bounded(&headers, body, cfg.max_body_bytes, cfg.idle_timeout).await {
        Ok(b) => b,
        Err(r) => return r.respond(svc, ROUTE),
    };
    let usage = r#"send {"add": {"id": N, "addr": "HOST:PORT"}} or {"remove": {"id": N}}"#;
    let change = match serde_json::from_slice::<Change>(&bytes) {
        Ok(Change {
            add: Some(a),
            remove: None,
        }) => crate::raft::rpc::MemberChange::Add {
            id: a.id,
            addr: a.addr,
        },
        Ok(Change {
            add: None,
            remove: Some(r),
        }) => crate::raft::rpc::MemberChange::Remove { id: r.id },
        Ok(_) => {
            return Reject::bad("bad_body", format!("give exactly one change; {usage}"))
                .respond(svc, ROUTE)
        }
        Err(e) => return Reject::bad("bad_body", format!("{e}; {usage}")).respond(svc, ROUTE),
    };
    let Some(cluster) = svc.cluster() else {
        return Reject::new(
            StatusCode::CONFLICT,
            "not_a_cluster",
            "this node runs alone (no --peers); membership changes need a cluster",
        )
        .respond(svc, ROUTE);
    };
    match cluster.change_members(change).await {
        Ok(()) => Json(serde_json::json!({ "ok": true, "status": svc.status() })).into_response(),
        Err(e) => Reject::bad("membership_change_failed", e).respond(svc, ROUTE),
    }
}

async fn not_found(State(st): State<AppState>, method: Method, uri: Uri) -> Response {
    Reject::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "there is no {method} {}; the API serves: {ROUTES}",
            quote(uri.path())
        ),
    )
    .respond(&st.service, "fallback")
}

async fn method_not_allowed(State(st): State<AppState>, method: Method, uri: Uri) -> Response {
    Reject::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} does not accept {method}; the API serves: {ROUTES}",
            quote(uri.path())
        ),
    )
    .respond(&st.service, "fallback")
}
