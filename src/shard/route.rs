//! Key -> shard routing, one of two ways chosen when a cluster is created ([`Sharding`]):
//! - `hash` (the default): FNV-1a over the storage key's bytes (the limit's prefix, then the
//!   key), then jump consistent hash;
//! - `slots`: Redis Cluster's: the key's hash slot (CRC16 of the key, or of its `{hash tag}`,
//!   mod 16384), and each shard owns one contiguous range of slots. A Redis Cluster client
//!   (and `redis-benchmark --cluster`) then finds every key's leader from `CLUSTER SLOTS`.
//!
//! Why jump hash: no ring to store or keep in sync, perfectly even spread, and when the shard
//! count grows from `n` to `n + 1` only `1/(n+1)` of keys move (Lamping & Veach, 2014). Why
//! FNV-1a: a hash that is the same on every node, build and version (routing must agree
//! across a cluster); std's `DefaultHasher` promises neither. The per-shard tables use a
//! hasher seeded per process (see `shard::state`), so keys chosen offline can skew shard
//! load but not degrade the tables themselves.

/// A stable 64-bit FNV-1a hash.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_on(0xcbf2_9ce4_8422_2325, bytes)
}

/// FNV-1a continued over `bytes` from `h`, the hash of what came before them:
/// `fnv1a_on(fnv1a(a), b) == fnv1a(a ++ b)`. Lets a key's prefix be hashed once.
pub fn fnv1a_on(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Jump consistent hash: a bucket in `0..buckets` (`buckets >= 1`).
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < buckets.max(1) as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// The shard that owns storage key `key` under `hash` sharding.
pub fn shard_of(key: &str, shards: u32) -> u32 {
    jump(fnv1a(key.as_bytes()), shards)
}

/// The shard that owns the key whose [`fnv1a`] is `hash`, under `hash` sharding.
pub fn shard_of_hash(hash: u64, shards: u32) -> u32 {
    jump(hash, shards)
}

/// How many hash slots a Redis Cluster has, and a `slots` cluster too.
pub const SLOTS: u16 = 16384;

/// How keys are spread over shards. Fixed when a cluster is created: every member must use
/// the same (the data directory records it; see `crate::member`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sharding {
    /// `jump(fnv1a(storage key))`: each limit's keys spread on their own.
    #[default]
    Hash,
    /// The key's Redis hash slot, each shard owning a contiguous range of slots: what Redis
    /// Cluster clients route by. A key's limits all live on its slot's shard.
    Slots,
}

impl Sharding {
    pub fn name(self) -> &'static str {
        match self {
            Sharding::Hash => "hash",
            Sharding::Slots => "slots",
        }
    }

    /// Parses `hash` or `slots`.
    pub fn parse(text: &str) -> Option<Sharding> {
        match text {
            "hash" => Some(Sharding::Hash),
            "slots" => Some(Sharding::Slots),
            _ => None,
        }
    }

    /// The route of `key` (as the client gave it) whose storage key is `prefix ++ key`, the
    /// prefix's [`fnv1a`] being `prefix_hash`: what [`Sharding::shard`] maps to a shard.
    pub fn route(self, prefix_hash: u64, key: &str) -> u64 {
        match self {
            Sharding::Hash => fnv1a_on(prefix_hash, key.as_bytes()),
            Sharding::Slots => key_slot(key.as_bytes()) as u64,
        }
    }

    /// The shard of a key whose route (from [`Sharding::route`]) is `route`.
    pub fn shard(self, route: u64, shards: u32) -> u32 {
        match self {
            Sharding::Hash => jump(route, shards),
            Sharding::Slots => slot_shard((route % SLOTS as u64) as u16, shards),
        }
    }
}

/// The shard that owns hash slot `slot` when `shards` shards split the slots into
/// contiguous ranges of (nearly) equal size. With more shards than slots, some own none.
pub fn slot_shard(slot: u16, shards: u32) -> u32 {
    (slot as u64 * shards.max(1) as u64 / SLOTS as u64) as u32
}

/// The slots shard `shard` owns of `shards`, as an inclusive range (`None`: no slot).
pub fn shard_slots(shard: u32, shards: u32) -> Option<(u16, u16)> {
    let shards = shards.max(1) as u64;
    // The least slot s with s * shards / SLOTS >= shard.
    let first = |shard: u64| (shard * SLOTS as u64).div_ceil(shards);
    let (start, end) = (first(shard as u64), first(shard as u64 + 1));
    (start < end && end <= SLOTS as u64).then(|| (start as u16, (end - 1) as u16))
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), Redis Cluster's key hash.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A key's Redis Cluster hash slot: CRC16 of the key mod 16384, or of its hash tag, the
/// bytes between the first `{` and the first `}` after it when there are any (so that
/// `{user1}.a` and `{user1}.b` share a slot), exactly as Redis computes it.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) & (SLOTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_is_stable_across_runs_and_builds() {
        // Pinned values: a change here would move keys between shards of a running cluster.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_on(fnv1a(b"login:"), b"alice"), fnv1a(b"login:alice"));
        assert_eq!(
            shard_of("login:account:alice", 16),
            shard_of("login:account:alice", 16)
        );
    }

    #[test]
    fn keys_spread_evenly_over_shards() {
        let mut counts = [0u32; 16];
        for i in 0..160_000 {
            counts[shard_of(&format!("key-{i}"), 16) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn growing_the_shard_count_moves_few_keys() {
        let moved = (0..100_000)
            .filter(|i| {
                let k = format!("k{i}");
                shard_of(&k, 16) != shard_of(&k, 17)
            })
            .count();
        // Expected 1/17 = 5.9%; a modulo scheme would move ~94%.
        assert!(moved < 7_000, "{moved} of 100000 moved");
    }

    #[test]
    fn key_slots_are_redis_clusters() {
        // Redis's own: CRC16("123456789") = 0x31C3 (the XMODEM check value), CLUSTER
        // KEYSLOT of these keys, and the hash tag rules of the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"{user1000}.followers"), key_slot(b"user1000"));
        // Each as redis-server 7.0.15 answered `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
        assert_eq!(key_slot(b"foo{}{bar}"), 8363);
        assert_eq!(key_slot(b"foo{{bar}}zap"), 4015);
        assert_eq!(key_slot(b"foo{bar}{zap}"), 5061);
        assert_eq!(key_slot(b"{unclosed"), 470);
    }

    #[test]
    fn slot_ranges_cover_every_slot_once_and_agree_with_slot_shard() {
        for shards in [1, 2, 3, 7, 16, 100, 16384, 20000] {
            let mut next = 0u32;
            for shard in 0..shards {
                if let Some((start, end)) = shard_slots(shard, shards) {
                    assert_eq!(start as u32, next, "{shards} shards, shard {shard}");
                    assert!(end >= start);
                    for slot in [start, end] {
                        assert_eq!(slot_shard(slot, shards), shard, "{shards}: slot {slot}");
                    }
                    next = end as u32 + 1;
                }
            }
            assert_eq!(next, SLOTS as u32, "{shards} shards leave slots unowned");
        }
        assert_eq!(shard_slots(0, 3), Some((0, 5461)));
        assert_eq!(shard_slots(2, 3), Some((10923, 16383)));
        assert_eq!(Sharding::Slots.shard(key_slot(b"foo") as u64, 3), 2);
    }
}
