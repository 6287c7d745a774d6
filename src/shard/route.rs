//! Key -> shard routing: FNV-1a over the key's bytes, then jump consistent hash.
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

/// The shard that owns `key`.
pub fn shard_of(key: &str, shards: u32) -> u32 {
    jump(fnv1a(key.as_bytes()), shards)
}

/// The shard that owns the key whose [`fnv1a`] is `hash`.
pub fn shard_of_hash(hash: u64, shards: u32) -> u32 {
    jump(hash, shards)
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
}
