//! Turning a request into shard commands: validation and limit lookup.
//!
//! Everything a client can get wrong is caught here, before any shard is touched, so a bad
//! request changes no state.

use super::{shown, CheckError, CheckItem, CheckRequest, InlineLimit, LimitRef};
use crate::config::NodeConfig;
use crate::limiter::{Algorithm, Limit, Nanos};
use crate::policy::{OnUnavailable, PolicySet};
use crate::shard::command::Command;
use crate::shard::route::{fnv1a, fnv1a_on, key_slot, Sharding};
use std::borrow::Cow;
use std::cell::RefCell;

/// Longest request id accepted, in bytes.
pub const MAX_REQUEST_ID: usize = 128;

/// One item, resolved against the policy set.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The limit's name (`inline` for request-supplied limits).
    pub name: Cow<'static, str>,
    /// The key as the client gave it.
    pub key: String,
    /// The key in the shard's table: the limit's prefix, then the key.
    pub storage_key: String,
    /// What routes the key to its shard (see [`crate::shard::route`]): `fnv1a(storage_key)`
    /// under `hash` sharding, the key's hash slot under `slots`.
    pub route: u64,
    /// The key type for logs: the prefix without its trailing separator.
    pub key_type: Cow<'static, str>,
    pub limit: Limit,
    pub period_ns: Nanos,
    /// The item's cost; 0 when its check can never pass ([`never_passes`]) and it is only
    /// peeked at.
    pub cost: u64,
    pub shadow: bool,
    pub on_full: OnUnavailable,
    /// `consistency = "fast"`: a cluster leader may answer before the decision commits.
    pub fast: bool,
}

impl Resolved {
    /// The check command for this item. The storage key moves into it when `last_use`: a
    /// check of one item never needs it again (see [`crate::service::Service`]'s refunds).
    pub fn command(&mut self, request_id: Option<&str>, index: usize, last_use: bool) -> Command {
        // Each item is remembered on its own shard under the request's id.
        let request_id =
            request_id.map(|id| item_request_id(id, index, self.cost, &self.storage_key));
        Command::Check {
            key: if last_use {
                std::mem::take(&mut self.storage_key)
            } else {
                self.storage_key.clone()
            },
            limit: self.limit.clone(),
            cost: self.cost,
            request_id,
            on_full: self.on_full,
        }
    }

    /// True when this item denies its check whatever its key's state: it is not a shadow
    /// limit's (which never denies), and its cost is above its limit's capacity (`never`).
    pub fn can_never_pass(&self) -> bool {
        !self.shadow && self.cost > self.limit.capacity()
    }

    /// The refund of this item's admission at `admitted_at` in an entry of `epoch`, item
    /// `index` of a check with `request_id` (the shard gives an admission remembered under
    /// the id back once).
    pub fn refund(
        &self,
        admitted_at: Nanos,
        epoch: u64,
        request_id: Option<&str>,
        index: usize,
    ) -> Command {
        Command::Refund {
            key: self.storage_key.clone(),
            limit: self.limit.clone(),
            cost: self.cost,
            admitted_at,
            request_id: request_id
                .map(|id| item_request_id(id, index, self.cost, &self.storage_key)),
            epoch,
        }
    }
}

/// Whether a check of several items can never pass: one of its items can never pass
/// ([`Resolved::can_never_pass`]). [`crate::service::Service`] decides such a check without
/// spending.
pub fn never_passes(items: &[Resolved]) -> bool {
    items.len() > 1 && items.iter().any(Resolved::can_never_pass)
}

/// The id item `index` of a check with request id `id` is remembered under on its shard:
/// the request's id, the item's place, its cost and its key in the shard's table (the
/// limit's prefix, then the key). A request id names one check: the same id on another key,
/// limit or cost is another check, decided afresh, not given the first one's answer (which
/// let one id admit any number of keys without spending). The id's length comes first, so
/// no two (id, index, cost, key) give one string.
pub fn item_request_id(id: &str, index: usize, cost: u64, storage_key: &str) -> String {
    format!("{}:{id}#{index}#{cost}#{storage_key}", id.len())
}

fn invalid(message: impl Into<String>) -> CheckError {
    CheckError::InvalidInput(message.into())
}

/// Validates a request and resolves every item, or says what is wrong and how to fix it.
/// Each item's key moves into its [`Resolved`] (the request is not needed afterwards):
/// allocations per decision showed in profiles of pipelined load.
pub fn request(
    req: &mut CheckRequest,
    policies: &PolicySet,
    config: &NodeConfig,
) -> Result<Vec<Resolved>, CheckError> {
    if req.items.is_empty() {
        return Err(invalid("a check needs at least one limit and key"));
    }
    if req.items.len() > config.max_items {
        return Err(invalid(format!(
            "a check may name at most {} limits; {} were given",
            config.max_items,
            req.items.len()
        )));
    }
    if let Some(id) = &req.request_id {
        if id.is_empty() || id.len() > MAX_REQUEST_ID {
            return Err(invalid(format!(
                "`request_id` must be 1 to {MAX_REQUEST_ID} bytes"
            )));
        }
    }
    let mut out = Vec::with_capacity(req.items.len());
    for i in &mut req.items {
        out.push(item(i, policies, config)?);
    }
    Ok(out)
}

fn item(
    item: &mut CheckItem,
    policies: &PolicySet,
    config: &NodeConfig,
) -> Result<Resolved, CheckError> {
    if item.key.is_empty() {
        return Err(invalid(
            "`key` is empty; send the identity to limit (account, IP, API key)",
        ));
    }
    if item.key.len() > config.max_key_len {
        return Err(invalid(format!(
            "`key` is {} bytes; the most accepted is {} (hash long keys)",
            item.key.len(),
            config.max_key_len
        )));
    }
    match &item.limit {
        LimitRef::Named(name) => {
            let (limit, options) = policies.get(name).ok_or_else(|| {
                // Over RESP a name may be as long as an argument: shown bounded.
                CheckError::UnknownLimit(shown(name.as_bytes(), 128), policies.names())
            })?;
            let storage_key = concat(&[&options.key_prefix, &item.key]);
            let route = match config.sharding {
                Sharding::Hash => fnv1a(storage_key.as_bytes()),
                Sharding::Slots => key_slot(item.key.as_bytes()) as u64,
            };
            Ok(Resolved {
                name: Cow::Owned(name.clone()),
                route,
                storage_key,
                key: std::mem::take(&mut item.key),
                key_type: Cow::Owned(options.key_prefix.trim_end_matches(':').to_string()),
                period_ns: limit.period(),
                limit: limit.clone(),
                cost: item.cost,
                shadow: options.shadow,
                on_full: options.on_unavailable,
                fast: options.consistency == crate::policy::Consistency::Fast,
            })
        }
        LimitRef::Inline(spec) => {
            if !policies.inline.allow {
                return Err(invalid(
                    "inline limits are disabled by the policy file; set `[inline] allow = true` or name a limit of the file",
                ));
            }
            let burst = spec.burst.unwrap_or(spec.limit);
            let limit = Limit::new(spec.algorithm, spec.limit, spec.period_ns, burst)
                .map_err(|e| invalid(format!("inline limit: {e}")))?;
            // The parameters are part of the key, so two inline limits never share state.
            let (storage_key, route) = inline_storage_key(
                spec.algorithm,
                spec.limit,
                spec.period_ns,
                burst,
                &item.key,
                config.sharding,
            );
            Ok(Resolved {
                name: Cow::Borrowed("inline"),
                key: std::mem::take(&mut item.key),
                storage_key,
                route,
                key_type: Cow::Borrowed("inline"),
                period_ns: spec.period_ns,
                limit,
                cost: item.cost,
                shadow: false,
                on_full: OnUnavailable::Deny,
                fast: false,
            })
        }
    }
}

thread_local! {
    /// The parameters, storage-key prefix and the prefix's hash of the last inline limit
    /// resolved on this thread: clients repeat one `CL.THROTTLE` limit over many keys, and
    /// building and hashing the prefix (three numbers, eight pieces, 30 bytes) showed in
    /// profiles of pipelined load.
    static INLINE_PREFIX: RefCell<(Option<InlineParams>, String, u64)> =
        const { RefCell::new((None, String::new(), 0)) };
}

type InlineParams = (Algorithm, u64, Nanos, u64);

/// `inline:ALGORITHM:LIMIT:PERIOD_NS:BURST:KEY`, and its route under `sharding`.
fn inline_storage_key(
    algorithm: Algorithm,
    limit: u64,
    period_ns: Nanos,
    burst: u64,
    key: &str,
    sharding: Sharding,
) -> (String, u64) {
    INLINE_PREFIX.with_borrow_mut(|(last, prefix, prefix_hash)| {
        let params = (algorithm, limit, period_ns, burst);
        if *last != Some(params) {
            *prefix = inline_prefix(algorithm, limit, period_ns, burst);
            *prefix_hash = fnv1a(prefix.as_bytes());
            *last = Some(params);
        }
        (concat(&[prefix, key]), sharding.route(*prefix_hash, key))
    })
}

/// `inline:ALGORITHM:LIMIT:PERIOD_NS:BURST:`, an inline limit's storage-key prefix.
fn inline_prefix(algorithm: Algorithm, limit: u64, period_ns: Nanos, burst: u64) -> String {
    let mut numbers = [
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
    ];
    let [limit_s, period_s, burst_s] = &mut numbers;
    concat(&[
        crate::policy::INLINE_KEY_PREFIX,
        algorithm.name(),
        ":",
        limit_s.format(limit),
        ":",
        period_s.format(period_ns),
        ":",
        burst_s.format(burst),
        ":",
    ])
}

/// The route of `key` under the inline limit `spec`, as [`request`] resolves it: what a
/// client computes to find the key's shard.
pub(crate) fn inline_route(spec: &InlineLimit, key: &str, sharding: Sharding) -> u64 {
    match sharding {
        Sharding::Hash => {
            let burst = spec.burst.unwrap_or(spec.limit);
            let prefix = inline_prefix(spec.algorithm, spec.limit, spec.period_ns, burst);
            fnv1a_on(fnv1a(prefix.as_bytes()), key.as_bytes())
        }
        Sharding::Slots => key_slot(key.as_bytes()) as u64,
    }
}

/// The strings joined, in one allocation.
fn concat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::SECOND;
    use crate::service::InlineLimit;

    fn throttle(key: &str, limit: u64, burst: u64) -> CheckRequest {
        CheckRequest {
            items: vec![CheckItem {
                limit: LimitRef::Inline(InlineLimit {
                    algorithm: Algorithm::Gcra,
                    limit,
                    period_ns: 60 * SECOND,
                    burst: Some(burst),
                }),
                key: key.into(),
                cost: 1,
            }],
            request_id: None,
        }
    }

    #[test]
    fn inline_storage_keys_carry_each_limits_own_parameters() {
        let policies = PolicySet::from_toml(
            "[inline]\nallow = true\n[limits.api]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n",
        ).unwrap();
        let config = NodeConfig::default();
        // Alternating limits: the remembered prefix of the last one must not leak into the next.
        for (key, limit, burst, want) in [
            ("a", 30, 16, "inline:gcra:30:60000000000:16:a"),
            ("b", 30, 16, "inline:gcra:30:60000000000:16:b"),
            ("a", 31, 16, "inline:gcra:31:60000000000:16:a"),
            ("a", 31, 17, "inline:gcra:31:60000000000:17:a"),
            ("a", 30, 16, "inline:gcra:30:60000000000:16:a"),
        ] {
            let resolved = request(&mut throttle(key, limit, burst), &policies, &config).unwrap();
            assert_eq!(resolved[0].storage_key, want);
            assert_eq!(resolved[0].route, fnv1a(want.as_bytes()));
            // What a client computes to route the key (`QR.ROUTES`) is the same.
            let LimitRef::Inline(spec) = &throttle(key, limit, burst).items[0].limit else {
                unreachable!()
            };
            assert_eq!(inline_route(spec, key, Sharding::Hash), resolved[0].route);
        }
        let mut named = throttle("k", 1, 1);
        named.items[0].limit = LimitRef::Named("api".into());
        let resolved = request(&mut named, &policies, &config).unwrap();
        assert_eq!(resolved[0].route, fnv1a(resolved[0].storage_key.as_bytes()));
    }

    #[test]
    fn slot_sharding_routes_every_limit_of_a_key_by_the_keys_hash_slot() {
        let policies = PolicySet::from_toml(
            "[inline]\nallow = true\n[limits.api]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n",
        ).unwrap();
        let config = NodeConfig {
            sharding: Sharding::Slots,
            ..NodeConfig::default()
        };
        for key in ["foo", "{user1}.a", "bar"] {
            let slot = key_slot(key.as_bytes()) as u64;
            let inline = request(&mut throttle(key, 30, 16), &policies, &config).unwrap();
            assert_eq!(inline[0].route, slot, "{key}");
            assert_eq!(
                inline[0].storage_key,
                format!("inline:gcra:30:60000000000:16:{key}")
            );
            let LimitRef::Inline(spec) = &throttle(key, 30, 16).items[0].limit else {
                unreachable!()
            };
            assert_eq!(inline_route(spec, key, Sharding::Slots), slot);
            let mut named = throttle(key, 1, 1);
            named.items[0].limit = LimitRef::Named("api".into());
            let named = request(&mut named, &policies, &config).unwrap();
            assert_eq!(named[0].route, slot, "{key}");
        }
        assert_eq!(inline_route_of("foo"), 12182);
    }

    fn inline_route_of(key: &str) -> u64 {
        let LimitRef::Inline(spec) = &throttle(key, 1, 1).items[0].limit else {
            unreachable!()
        };
        inline_route(spec, key, Sharding::Slots)
    }
}
