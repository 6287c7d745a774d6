//! Reading a request body within the node's bounds: at most `max_body_bytes` (413 beyond,
//! decided from `Content-Length` before a byte of the body is read, so a client that sent
//! `Expect: 100-continue` never uploads it) and within `idle_timeout` (408), so a client
//! trickling its body cannot hold a connection and its task forever.

use super::reject::Reject;
use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, StatusCode};
use std::time::Duration;

fn too_large(len: Option<u64>, max: usize) -> Reject {
    let size = match len {
        Some(n) => format!("{n} bytes"),
        None => format!("over {max} bytes"),
    };
    Reject::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!(
            "the body is {size}; at most {max} are accepted; send fewer checks or shorter keys"
        ),
    )
}

/// The declared length, when the request declares one.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Reject> {
    let Some(v) = headers.get(CONTENT_LENGTH) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            Reject::bad(
                "bad_content_length",
                "`Content-Length` is not a whole number",
            )
        })
}

/// Reads the whole body, refusing one over `max` bytes or slower than `timeout`.
pub async fn read_bounded(
    headers: &HeaderMap,
    body: Body,
    max: usize,
    timeout: Duration,
) -> Result<Bytes, Reject> {
    if let Some(len) = content_length(headers)? {
        if len > max as u64 {
            return Err(too_large(Some(len), max));
        }
    }
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, max)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let limit = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if limit {
                Err(too_large(None, max))
            } else {
                Err(Reject::bad(
                    "body_read_failed",
                    format!("the body could not be read ({e}); resend the request"),
                ))
            }
        }
        Err(_) => Err(Reject::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the body did not arrive within {}; send it at once",
                humantime::format_duration(timeout)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_413_before_reading() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("1000000"));
        let r = read_bounded(&h, Body::empty(), 10, SECOND)
            .await
            .unwrap_err();
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(r.message.contains("1000000 bytes"), "{}", r.message);
    }

    #[tokio::test]
    async fn an_undeclared_body_over_the_limit_is_413() {
        let r = read_bounded(&HeaderMap::new(), Body::from(vec![b'x'; 11]), 10, SECOND)
            .await
            .unwrap_err();
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
        let ok = read_bounded(&HeaderMap::new(), Body::from(vec![b'x'; 10]), 10, SECOND).await;
        assert_eq!(ok.unwrap().len(), 10);
    }

    #[tokio::test]
    async fn a_garbled_content_length_is_400() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("-5"));
        let r = read_bounded(&h, Body::empty(), 10, SECOND)
            .await
            .unwrap_err();
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
    }
}
