//! The client's retry policy, pure: what to wait before the next attempt.
//!
//! Pure (the current time and the random number are arguments) so that every rule is
//! tested exactly: a server's `Retry-After` is honoured as given (it is the earliest moment
//! the request can succeed, so retrying earlier only burns an attempt) unless it is longer
//! than the caller will wait; without one, exponential backoff with *full* jitter
//! (uniform in `[0, min(cap, base * 2^attempt)]`) spreads retrying clients out instead of
//! synchronising them; and a bounded number of attempts and of total waiting means a
//! client never retries forever.
//!
//! A quorate `429` without `Retry-After` means the check can never succeed (its cost is
//! above the limit's capacity; the body says `"retryable": false`): do not retry it.

use std::time::{Duration, UNIX_EPOCH};

/// A parsed `Retry-After` header: how long to wait from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RetryAfter(pub Duration);

/// Longest delta-seconds text read; longer numbers saturate (they are far beyond any cap).
const MAX_DIGITS: usize = 19;

impl RetryAfter {
    /// Parses both forms of RFC 9110 §10.2.3: delay-seconds (`"120"`) and an HTTP-date
    /// (`"Fri, 31 Dec 1999 23:59:59 GMT"`, also the obsolete RFC 850 and asctime forms),
    /// the latter relative to `now_unix_secs`. A date in the past means "now" (zero).
    /// As a leniency, a fractional number of seconds (`"1.5"`) is rounded up, never down.
    /// Negative numbers, empty and unparseable values give `None`.
    pub fn parse(value: &str, now_unix_secs: u64) -> Option<RetryAfter> {
        let v = value.trim_matches([' ', '\t']);
        if v.is_empty() {
            return None;
        }
        if v.as_bytes()[0].is_ascii_digit() {
            return parse_seconds(v).map(RetryAfter);
        }
        let date = httpdate::parse_http_date(v).ok()?;
        let at = date
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Some(RetryAfter(Duration::from_secs(
            at.saturating_sub(now_unix_secs),
        )))
    }

    pub fn delay(self) -> Duration {
        self.0
    }
}

/// `DIGITS` or `DIGITS.DIGITS` (rounded up); saturating.
fn parse_seconds(v: &str) -> Option<Duration> {
    let (whole, frac) = match v.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (v, None),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let round_up = match frac {
        None => false,
        Some(f) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => {
            f.bytes().any(|b| b != b'0')
        }
        Some(_) => return None,
    };
    let digits = whole.trim_start_matches('0');
    let secs = if digits.len() > MAX_DIGITS {
        u64::MAX
    } else {
        digits.parse::<u64>().unwrap_or(0)
    };
    let secs = secs.saturating_add(round_up as u64);
    Some(Duration::from_secs(secs))
}

/// When and whether to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Most attempts in all, the first included (1 = never retry).
    pub max_attempts: u32,
    /// The backoff ceiling of the first retry; doubled for each later one.
    pub base: Duration,
    /// The largest single wait: a backoff ceiling is capped here, and a `Retry-After`
    /// beyond it is not waited for (the call gives up instead).
    pub cap: Duration,
    /// The most waiting in all, over every retry of one call.
    pub max_total: Duration,
}

impl Default for RetryPolicy {
    /// 4 attempts, 50 ms doubling to at most 2 s per wait, at most 5 s in all.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
            max_total: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `attempt` (0 for the first retry, after the first
    /// attempt failed), or `None` to give up: when the attempts are spent, or when the
    /// server's `Retry-After` is longer than `cap` or `max_total`. Without a `Retry-After`
    /// the wait is uniform in `[0, min(cap, base * 2^attempt)]`, drawn from `rng_u64`.
    pub fn delay(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        rng_u64: u64,
    ) -> Option<Duration> {
        if attempt.saturating_add(1) >= self.max_attempts {
            return None;
        }
        match retry_after {
            Some(wait) if wait > self.cap || wait > self.max_total => None,
            Some(wait) => Some(wait),
            None => Some(full_jitter(
                self.ceiling(attempt).min(self.max_total),
                rng_u64,
            )),
        }
    }

    /// Like [`RetryPolicy::delay`], also keeping the total wait of the call within
    /// `max_total`: `waited` is what this call has already waited. A backoff is shortened
    /// to the budget left; a `Retry-After` beyond it, or no budget left, gives up (retrying
    /// before the server's time would fail anyway).
    pub fn delay_within(
        &self,
        attempt: u32,
        waited: Duration,
        retry_after: Option<Duration>,
        rng_u64: u64,
    ) -> Option<Duration> {
        let left = self
            .max_total
            .checked_sub(waited)
            .filter(|left| !left.is_zero())?;
        let d = self.delay(attempt, retry_after, rng_u64)?;
        match retry_after {
            Some(_) if d > left => None,
            _ => Some(d.min(left)),
        }
    }

    /// `min(cap, base * 2^attempt)`, saturating.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doubled = 1u32
            .checked_shl(attempt)
            .and_then(|factor| self.base.checked_mul(factor));
        match doubled {
            Some(d) => d.min(self.cap),
            None => self.cap,
        }
    }
}

/// Uniform in `[0, ceiling]` (nanosecond resolution): the high half of `rng * (ceiling + 1)`.
fn full_jitter(ceiling: Duration, rng_u64: u64) -> Duration {
    let span = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX) as u128 + 1;
    let ns = (rng_u64 as u128 * span) >> 64;
    Duration::from_nanos(ns as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 784_111_777; // Sun, 06 Nov 1994 08:49:37 GMT
    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn parse(v: &str) -> Option<Duration> {
        RetryAfter::parse(v, NOW).map(RetryAfter::delay)
    }

    #[test]
    fn delay_seconds_parse() {
        assert_eq!(parse("0"), Some(S(0)));
        assert_eq!(parse("120"), Some(S(120)));
        assert_eq!(parse(" 7\t"), Some(S(7)));
        assert_eq!(parse("007"), Some(S(7)));
    }

    #[test]
    fn http_dates_parse_relative_to_now_in_all_three_forms() {
        assert_eq!(parse("Sun, 06 Nov 1994 08:50:37 GMT"), Some(S(60)));
        assert_eq!(parse("Sunday, 06-Nov-94 08:49:47 GMT"), Some(S(10)));
        assert_eq!(parse("Sun Nov  6 08:49:38 1994"), Some(S(1)));
    }

    #[test]
    fn dates_in_the_past_mean_now() {
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:36 GMT"), Some(S(0)));
        assert_eq!(parse("Thu, 01 Jan 1970 00:00:00 GMT"), Some(S(0)));
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:37 GMT"), Some(S(0)));
    }

    #[test]
    fn fractional_seconds_are_rounded_up_never_down() {
        assert_eq!(parse("1.5"), Some(S(2)));
        assert_eq!(parse("1.001"), Some(S(2)));
        assert_eq!(parse("2.000"), Some(S(2)));
        assert_eq!(parse("0.1"), Some(S(1)));
    }

    #[test]
    fn negative_and_garbage_values_are_none() {
        for v in [
            "",
            " ",
            "-1",
            "+5",
            "soon",
            "1s",
            "1.",
            ".5",
            "1.5.2",
            "1 2",
            "0x10",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "١٢",
        ] {
            assert_eq!(parse(v), None, "{v:?}");
        }
    }

    #[test]
    fn huge_delays_saturate_instead_of_failing() {
        assert_eq!(parse("99999999999999999999999999"), Some(S(u64::MAX)));
        assert_eq!(parse("18446744073709551615.5"), Some(S(u64::MAX)));
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            base: MS(100),
            cap: S(1),
            max_total: S(3),
        }
    }

    #[test]
    fn a_valid_retry_after_is_honoured_exactly() {
        assert_eq!(policy().delay(0, Some(MS(700)), 0), Some(MS(700)));
        assert_eq!(policy().delay(0, Some(S(0)), u64::MAX), Some(S(0)));
        assert_eq!(policy().delay(3, Some(S(1)), 12345), Some(S(1)));
    }

    #[test]
    fn a_retry_after_beyond_the_cap_or_the_total_gives_up() {
        assert_eq!(policy().delay(0, Some(S(1) + MS(1)), 0), None);
        let p = RetryPolicy {
            max_total: MS(500),
            ..policy()
        };
        assert_eq!(p.delay(0, Some(MS(600)), 0), None);
    }

    #[test]
    fn backoff_ceilings_double_from_base_up_to_the_cap() {
        let p = policy();
        let ceilings: Vec<Duration> = (0..6).map(|a| p.ceiling(a)).collect();
        assert_eq!(ceilings, [MS(100), MS(200), MS(400), MS(800), S(1), S(1)]);
        assert_eq!(p.ceiling(u32::MAX), S(1));
        let huge = RetryPolicy {
            base: Duration::MAX,
            cap: Duration::MAX,
            ..p
        };
        assert_eq!(huge.ceiling(1), Duration::MAX);
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_ceiling() {
        let p = policy();
        for attempt in 0..4 {
            let ceiling = p.ceiling(attempt);
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let (mut lo, mut hi) = (Duration::MAX, Duration::ZERO);
            for _ in 0..10_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let d = p.delay(attempt, None, x).unwrap();
                assert!(d <= ceiling, "{d:?} > {ceiling:?}");
                lo = lo.min(d);
                hi = hi.max(d);
            }
            assert!(lo < ceiling / 50 && hi > ceiling * 49 / 50, "{lo:?} {hi:?}");
        }
        assert_eq!(p.delay(0, None, 0), Some(S(0)));
        assert!(p.delay(0, None, u64::MAX).unwrap() <= MS(100));
        assert!(p.delay(0, None, u64::MAX).unwrap() >= MS(100) - Duration::from_nanos(1));
    }

    #[test]
    fn attempts_stop_at_max_attempts() {
        let p = policy();
        assert!(p.delay(3, None, 1).is_some());
        assert_eq!(p.delay(4, None, 1), None);
        assert_eq!(p.delay(4, Some(MS(1)), 1), None);
        assert_eq!(p.delay(u32::MAX, None, 1), None);
        let never = RetryPolicy {
            max_attempts: 1,
            ..p
        };
        assert_eq!(never.delay(0, None, 1), None);
        let zero = RetryPolicy {
            max_attempts: 0,
            ..p
        };
        assert_eq!(zero.delay(0, None, 1), None);
    }

    #[test]
    fn the_total_wait_of_a_call_is_bounded() {
        let p = policy();
        assert_eq!(p.delay_within(0, S(3), None, u64::MAX), None);
        assert_eq!(p.delay_within(0, S(4), None, u64::MAX), None);
        assert_eq!(p.delay_within(3, MS(2900), None, u64::MAX), Some(MS(100)));
        assert_eq!(p.delay_within(0, MS(2500), Some(MS(600)), 0), None);
        assert_eq!(p.delay_within(0, MS(2000), Some(MS(600)), 0), Some(MS(600)));
    }
}
