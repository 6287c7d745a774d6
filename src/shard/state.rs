//! A shard's state and the deterministic function that changes it.
//!
//! [`ShardState::apply`] is the state machine: the same batches in the same order give the
//! same state and the same answers on every replica. It reads no clock (time comes in the
//! batch) and its decisions never depend on hash-table iteration order.

use super::command::{Applied, Batch, Command, Fallback};
use super::ids::{Entries, IdTable};
use super::table::{KeyTable, Part, PartRef};
use crate::limiter::{Decision, KeyState, Limit, Nanos, Outcome, SECOND};
use crate::policy::OnUnavailable;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// A key's state and the limit that last decided it (eviction asks the limit whether the
/// state is fresh). The limit is the shard's one copy of it ([`Limits`]): 8 bytes a key
/// where the limit is 48, of an entry of 80 (a key's string, up to 24 bytes, included).
#[derive(Debug, Clone)]
struct Entry {
    limit: Arc<Limit>,
    state: KeyState,
}

/// One copy of each limit the shard's keys are under, for their entries to share. Only a
/// saving: a limit not found here (a copy of the state starts without them) gets a copy of
/// its own, and entries compare limits by value. Limits no entry holds any longer go at each
/// eviction, so there are never more than keys (a client may name a limit of its own per
/// key, inline).
#[derive(Debug, Clone, Default)]
struct Limits(HashSet<Arc<Limit>>);

impl Limits {
    /// The shard's copy of `limit`, made if it has none.
    fn get(&mut self, limit: &Limit) -> Arc<Limit> {
        if let Some(shared) = self.0.get(limit) {
            return shared.clone();
        }
        let shared = Arc::new(limit.clone());
        self.0.insert(shared.clone());
        shared
    }

    /// Takes back a limit an entry held: forgotten at once if no other entry holds it (a key
    /// whose limit changes with every check, inline, would otherwise leave one a check until
    /// the next eviction).
    fn release(&mut self, old: Arc<Limit>) {
        // The set's reference and `old`.
        if Arc::strong_count(&old) == 2 {
            self.0.remove(&*old);
        }
    }

    /// Forgets the limits only this set holds.
    fn forget_unused(&mut self) {
        self.0.retain(|l| Arc::strong_count(l) > 1);
    }
}

/// Remembered answers for request ids, expiring after the horizon (oldest first), in chunks
/// an image shares ([`IdTable`]). An id is held as its digest ([`digest16`]): 16 bytes in
/// place of a string on the heap twice (in the index and in the queue), so remembering one
/// allocates nothing but a new chunk every 256 ids.
type Idempotency = IdTable<Digest16, Remembered>;

/// The request ids remembered, in expiry order, with the time each expires from and what it
/// remembers: as an image carries them.
fn remembered(ids: &Entries<Digest16, Remembered>) -> Vec<(Nanos, Digest16, Remembered)> {
    ids.iter().copied().collect()
}

/// What a shard remembers of a request id's first decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Remembered {
    /// The decision a repeat gets. An admission that was refunded (its check was denied by
    /// another item) is a denial from then on, as its check was answered: a repeat whose
    /// other item is decided afresh (its denial lost with a leader) cannot spend what was
    /// given back, and a second refund finds nothing admitted to give back.
    decision: Decision,
    fallback: Fallback,
    /// The shard time it was made at: what a refund of it gives back from, and must name.
    at: Nanos,
    /// Of an admission the algorithm made: its key (a digest, [`digest16`]) and cost,
    /// what a refund under the id must name and may give back at most. Zero otherwise.
    key: Digest16,
    cost: u64,
}

impl Remembered {
    /// Whether a refund of `cost` on `key`, naming an admission at `at`, is of this
    /// admission, and it has not been given back: anything else under the id (a retry
    /// that named other keys or costs, an admission at the key cap that spent nothing, a
    /// late refund of a lost attempt's admission when the id was decided again) gets
    /// nothing.
    fn refundable(&self, key: &str, cost: u64, at: Nanos) -> bool {
        self.decision.allowed()
            && self.fallback == Fallback::No
            && self.at == at
            && self.cost == cost
            && self.key == digest16(key)
    }
}

/// 16 bytes of a string's SHA-256 ([`digest16`]).
type Digest16 = [u8; 16];

/// The first 16 bytes of a string's SHA-256: what the shard keeps of request ids, and of the
/// key of an admission under one (what a refund under the id must name). Clients choose
/// both, so the digest must resist collisions, unlike the tables' hash (a retry whose id
/// collided with another client's would get that client's answer): finding two strings
/// with one digest takes about 2^64 hashes. It is the same on every replica.
fn digest16(text: &str) -> Digest16 {
    use sha2::Digest;
    let full = sha2::Sha256::digest(text.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Who has left the shard's Raft group: every node id that was in one of its memberships and
/// not in the next. With the current members, that is every id the group has ever named.
/// It changes only as membership entries are
/// applied (in log order on every replica, [`ShardState::note_membership`]) and snapshots
/// carry it, so a member added later, or one that was down while an id came and went, knows
/// it too: what keeps a removed node's id from being given out again
/// (`Cluster::change_members`). It grows by one id per removal.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberHistory {
    /// The ids that were in a membership of the group and then not in the next one.
    pub removed: BTreeSet<u64>,
}

/// The bounds a shard keeps.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Most keys this shard holds.
    pub max_keys: u64,
    /// How long a request id's answer is remembered, in shard time.
    pub idempotency_horizon: Nanos,
    /// Most request ids remembered at once; beyond it the oldest is forgotten early.
    pub max_request_ids: usize,
}

/// A shard's state as a snapshot carries it (see [`ShardState::image`]).
#[derive(serde::Serialize)]
struct ImageRef<'a, K: serde::Serialize> {
    time: Nanos,
    keys: K,
    ids: &'a [(Nanos, Digest16, Remembered)],
    members: &'a MemberHistory,
}

impl<K: serde::Serialize> ImageRef<'_, K> {
    fn encode(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .expect("a shard image always encodes")
    }
}

/// The key table as an image carries it: `(key, limit, state)` in the table's own order,
/// encoded as a sequence (as a `Vec` of them is).
struct KeysRef<'a>(&'a KeyTable<Entry>);

impl serde::Serialize for KeysRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        keys_seq(s, self.0.len(), self.0.part_refs())
    }
}

/// The same from a copy of the table ([`PendingImage`]), each part dropped once encoded:
/// a part no copy shares any longer is not copied when the shard, applying on meanwhile,
/// changes it. So this encodes once: a second time it would give the length, no keys.
struct KeysOnce {
    len: usize,
    parts: RefCell<Vec<PartRef<Entry>>>,
}

impl serde::Serialize for KeysOnce {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        keys_seq(s, self.len, std::mem::take(&mut *self.parts.borrow_mut()))
    }
}

/// The `len` keys of `parts` as one sequence, part by part.
fn keys_seq<S, P>(s: S, len: usize, parts: impl IntoIterator<Item = P>) -> Result<S::Ok, S::Error>
where
    S: serde::Serializer,
    P: std::ops::Deref<Target = Part<Entry>>,
{
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(len))?;
    for part in parts {
        for (k, e) in part.iter() {
            seq.serialize_element(&(k.as_str(), &*e.limit, &e.state))?;
        }
    }
    seq.end()
}

/// A shard's state as of one apply, to encode as an image later, off the state machine's
/// lock ([`ShardState::pending_image`]): the key table and the request ids are copies that
/// share their parts ([`KeyTable::share`], [`IdTable::entries`]), so taking it costs the lock
/// a reference count per part, not an encoding of every key and id.
pub struct PendingImage {
    time: Nanos,
    keys: KeyTable<Entry>,
    ids: Entries<Digest16, Remembered>,
    members: MemberHistory,
}

impl PendingImage {
    /// The image's bytes ([`ShardState::image`]).
    pub fn encode(self) -> Vec<u8> {
        let image = ImageRef {
            time: self.time,
            keys: KeysOnce {
                len: self.keys.len(),
                parts: RefCell::new(self.keys.into_parts()),
            },
            ids: &remembered(&self.ids),
            members: &self.members,
        };
        image.encode()
    }
}

#[derive(serde::Deserialize)]
struct Image {
    time: Nanos,
    keys: Vec<(String, Limit, KeyState)>,
    ids: Vec<(Nanos, Digest16, Remembered)>,
    members: MemberHistory,
}

#[derive(Debug, Clone)]
pub struct ShardState {
    keys: KeyTable<Entry>,
    limits: Limits,
    ids: Idempotency,
    members: MemberHistory,
    bounds: Bounds,
    /// The time of the last applied batch.
    time: Nanos,
}

/// The answer to a new key at the key cap, per the limit's `on_unavailable`.
/// `local` has no other node to share with, so it answers like `deny`.
fn at_cap(limit: &Limit, on_full: OnUnavailable) -> Decision {
    let allowed = on_full == OnUnavailable::Allow;
    Decision {
        outcome: if allowed {
            Outcome::Allowed
        } else {
            Outcome::Denied
        },
        limit: limit.capacity(),
        remaining: 0,
        reset_after: 0,
        // Keys are evicted continuously; a second is the soonest a slot is likely free.
        retry_after: if allowed { 0 } else { SECOND },
        delay: 0,
    }
}

impl ShardState {
    pub fn new(bounds: Bounds) -> Self {
        ShardState {
            keys: KeyTable::default(),
            limits: Limits::default(),
            ids: Idempotency::default(),
            members: MemberHistory::default(),
            bounds,
            time: 0,
        }
    }

    /// The group's member history ([`MemberHistory`]).
    pub fn members(&self) -> &MemberHistory {
        &self.members
    }

    /// Notes a membership entry: the group's members were `before` and are `after` (every
    /// node each names, voters and learners).
    pub fn note_membership(&mut self, before: &BTreeSet<u64>, after: &BTreeSet<u64>) {
        self.members
            .removed
            .extend(before.difference(after).copied());
    }

    /// The time of the last applied batch: where a new owner's shard time continues from.
    pub fn time(&self) -> Nanos {
        self.time
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Applies a batch; one result per command, in order, each at its part's time.
    pub fn apply(&mut self, batch: &Batch) -> Vec<Applied> {
        // Shard time never runs backwards, whatever the batch says.
        self.time = self.time.max(batch.time);
        self.expire_ids(self.time);
        let mut parts = batch.later.iter().peekable();
        let mut out = Vec::with_capacity(batch.commands.len());
        for (i, c) in batch.commands.iter().enumerate() {
            let mut moved = false;
            while let Some(p) = parts.next_if(|p| p.from as usize <= i) {
                self.time = self.time.max(p.time);
                moved = true;
            }
            if moved {
                self.expire_ids(self.time);
            }
            out.push(self.apply_one(c, self.time, batch.epoch));
        }
        out
    }

    /// What applying `commands` at `now` would answer, if every one is a check without a
    /// request id that this state denies (or can never admit); `None` otherwise. Read only:
    /// a denial changes no state (the cluster answers such checks without a log entry).
    pub fn denials(&self, commands: &[Command], now: Nanos) -> Option<Vec<Applied>> {
        let now = self.time.max(now);
        let deny = |command: &Command| {
            let (key, limit, cost) = command.plain_check()?;
            let mut state = match self.keys.get(key) {
                // Stored under another limit (a reload changed it): applying would record
                // the new limit, which eviction then judges the key by, so it must be logged.
                Some(e) if *e.limit != *limit => return None,
                // A sliding log's state is one timestamp per admission in its window: too
                // large to copy for each check under the state machine's lock.
                Some(Entry {
                    state: KeyState::SlidingLog(_),
                    ..
                }) => return None,
                Some(e) => e.state.clone(),
                None => limit.new_state(),
            };
            let decision = limit.decide(&mut state, now, cost);
            (decision.outcome != Outcome::Allowed).then_some(Applied::Decided {
                decision,
                replayed: false,
                fallback: Fallback::No,
                at: now,
                epoch: 0,
            })
        };
        commands.iter().map(deny).collect()
    }

    fn apply_one(&mut self, command: &Command, now: Nanos, epoch: u64) -> Applied {
        match command {
            Command::Check {
                key,
                limit,
                cost,
                request_id,
                on_full,
            } => {
                let id = request_id.as_deref().map(digest16);
                if let Some(r) = id.as_ref().and_then(|id| self.ids.get(id)) {
                    // The first decision (a denial if it was refunded), and when it was
                    // made (what a refund names).
                    return Applied::Decided {
                        decision: r.decision,
                        replayed: true,
                        fallback: r.fallback,
                        at: r.at,
                        epoch,
                    };
                }
                let (decision, fallback) = self.decide(key, limit, *cost, *on_full, now);
                if let Some(id) = id {
                    let mut r = Remembered {
                        decision,
                        fallback,
                        at: now,
                        key: [0; 16],
                        cost: 0,
                    };
                    if decision.allowed() && fallback == Fallback::No && *cost > 0 {
                        (r.key, r.cost) = (digest16(key), *cost);
                    }
                    self.remember(id, r);
                }
                Applied::Decided {
                    decision,
                    replayed: false,
                    fallback,
                    at: now,
                    epoch,
                }
            }
            Command::Refund {
                key,
                limit,
                cost,
                admitted_at,
                request_id,
                epoch: admitted_in,
            } => {
                if request_id.is_none() && *admitted_in != epoch {
                    // Decided in another leadership's entry, which may have been lost (a fast
                    // admission) and then is not in this state: nothing to give back.
                    return Applied::Refunded;
                }
                if let Some(id) = request_id {
                    let id = digest16(id);
                    match self.ids.get(&id) {
                        // Found first, changed only then: the change copies the answer's
                        // chunk if an image still shares it.
                        Some(r) if r.refundable(key, *cost, *admitted_at) => {
                            if let Some(r) = self.ids.get_mut(&id) {
                                r.decision.outcome = Outcome::Denied;
                            }
                        }
                        // Given back already, or not this admission; or the id is not here,
                        // so neither is its admission: one a failover lost (a fast one), or
                        // one past the horizon. Nothing to give back.
                        _ => return Applied::Refunded,
                    }
                }
                // Only under the key's own limit: once a reload has changed it, the state is
                // in the new limit's units, which this refund's (its admission's) cannot be
                // read in, and nothing is given back.
                if let Some(e) = self.keys.get_mut(key).filter(|e| *e.limit == *limit) {
                    limit.refund(&mut e.state, *admitted_at, *cost);
                }
                Applied::Refunded
            }
            Command::Evict => {
                let gone = self.keys.retain(|_, e| !e.limit.is_fresh(&e.state, now));
                self.limits.forget_unused();
                Applied::Evicted(gone as u64)
            }
        }
    }

    fn decide(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: u64,
        on_full: OnUnavailable,
        now: Nanos,
    ) -> (Decision, Fallback) {
        if let Some(e) = self.keys.get_mut(key) {
            if *e.limit != *limit {
                // A reload changed the key's limit: its state is converted from the old one.
                limit.adopt(&e.limit, &mut e.state, now);
                let old = std::mem::replace(&mut e.limit, self.limits.get(limit));
                self.limits.release(old);
            }
            return (limit.decide(&mut e.state, now, cost), Fallback::No);
        }
        let mut state = limit.new_state();
        let decision = limit.decide(&mut state, now, cost);
        if limit.is_fresh(&state, now) {
            // Nothing to remember (a peek, a denial): the key stays "never seen".
            return (decision, Fallback::No);
        }
        if self.keys.len() as u64 >= self.bounds.max_keys {
            return (at_cap(limit, on_full), Fallback::KeyCap);
        }
        let limit = self.limits.get(limit);
        self.keys.insert(key.into(), Entry { limit, state });
        (decision, Fallback::No)
    }

    fn remember(&mut self, id: Digest16, remembered: Remembered) {
        let now = remembered.at;
        if self.ids.len() >= self.bounds.max_request_ids {
            self.ids.forget_oldest();
        }
        let expires = now.saturating_add(self.bounds.idempotency_horizon);
        self.ids.insert(expires, id, remembered);
    }

    fn expire_ids(&mut self, now: Nanos) {
        while self.ids.oldest().is_some_and(|at| at <= now) {
            self.ids.forget_oldest();
        }
    }

    /// The whole state as bytes (a Raft snapshot): the keys in the table's order, the
    /// request ids in expiry order. The keys are not sorted: the sort was four fifths of an
    /// image's time (`cargo bench --bench apply -- image`). Equal states may thus encode
    /// differently (replicas compare [`ShardState::digest`]s).
    pub fn image(&self) -> Vec<u8> {
        let image = ImageRef {
            time: self.time,
            keys: KeysRef(&self.keys),
            ids: &remembered(&self.ids.entries()),
            members: &self.members,
        };
        image.encode()
    }

    /// The state as of now, to encode as an image later ([`PendingImage::encode`]): what a
    /// snapshot takes between two applies, encoded while the shard applies on.
    pub fn pending_image(&mut self) -> PendingImage {
        PendingImage {
            time: self.time,
            keys: self.keys.share(),
            ids: self.ids.entries(),
            members: self.members.clone(),
        }
    }

    /// A copy of the state whose key table shares its parts with this one's
    /// ([`KeyTable::share`]): a reference count per part, where `clone` copies every key.
    /// The request ids share their answers too; their index is copied ([`IdTable`]). What a
    /// fast leader's speculative state starts from.
    pub fn share(&mut self) -> ShardState {
        ShardState {
            keys: self.keys.share(),
            // Not copied: a copy per entry of a fast leader's, and the limits are only a
            // saving (the copy makes its own for the keys it adds).
            limits: Limits::default(),
            ids: self.ids.clone(),
            members: self.members.clone(),
            bounds: self.bounds,
            time: self.time,
        }
    }

    /// Rebuilds a state from [`ShardState::image`] bytes, with this node's bounds.
    /// Malformed bytes are an error, never a panic.
    pub fn from_image(bytes: &[u8], bounds: Bounds) -> Result<ShardState, String> {
        let (image, used): (Image, usize) = bincode::serde::decode_from_slice(
            bytes,
            bincode::config::standard().with_limit::<{ 1 << 34 }>(),
        )
        .map_err(|e| format!("shard image: {e}"))?;
        if used != bytes.len() {
            return Err(format!(
                "shard image: {} trailing bytes",
                bytes.len() - used
            ));
        }
        let mut state = ShardState::new(bounds);
        state.time = image.time;
        state.members = image.members;
        for (key, limit, key_state) in image.keys {
            let limit = state.limits.get(&limit);
            state.keys.insert(
                key.into(),
                Entry {
                    limit,
                    state: key_state,
                },
            );
        }
        for (at, id, remembered) in image.ids {
            state.ids.insert(at, id, remembered);
        }
        Ok(state)
    }

    /// A digest of the whole state ([`ShardState::image`]: keys, their limits and states,
    /// the request ids with what each remembers, refunds included, and the time), for
    /// comparing replicas: independent of the key table's iteration order (each key's
    /// encoding is hashed, the hash mixed, and the results summed: unmixed, FNV-1a's last
    /// step is a multiplication of `(rest ^ last byte)`, so the sum of two keys' hashes
    /// could stay the same with their last bytes swapped, e.g. two counts).
    pub fn digest(&self) -> u64 {
        use super::route::fnv1a;
        let config = bincode::config::standard();
        let mut entry = Vec::new();
        let keys = self.keys.iter().fold(0u64, |sum, (k, e)| {
            entry.clear();
            bincode::serde::encode_into_std_write((k, &*e.limit, &e.state), &mut entry, config)
                .expect("a key's state always encodes");
            sum.wrapping_add(mix(fnv1a(&entry)))
        });
        let rest = ImageRef {
            time: self.time,
            keys: &[] as &[(String, Limit, KeyState)],
            ids: &remembered(&self.ids.entries()),
            members: &self.members,
        };
        let mut bytes =
            bincode::serde::encode_to_vec(&rest, config).expect("a shard image always encodes");
        bytes.extend_from_slice(&keys.to_le_bytes());
        bytes.extend_from_slice(&(self.keys.len() as u64).to_le_bytes());
        fnv1a(&bytes)
    }
}

/// The 64-bit finaliser of MurmurHash3: every input bit flips about half the output bits.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    fn bounds(max_keys: u64) -> Bounds {
        Bounds {
            max_keys,
            idempotency_horizon: 10 * SECOND,
            max_request_ids: 1000,
        }
    }

    fn check(key: &str, limit: &Limit, cost: u64, id: Option<&str>) -> Command {
        Command::Check {
            key: key.into(),
            limit: limit.clone(),
            cost,
            request_id: id.map(Into::into),
            on_full: OnUnavailable::Deny,
        }
    }

    fn decided(a: &Applied) -> Decision {
        match a {
            Applied::Decided { decision, .. } => *decision,
            other => panic!("not a decision: {other:?}"),
        }
    }

    fn tb() -> Limit {
        Limit::new(Algorithm::TokenBucket, 1, SECOND, 2).unwrap()
    }

    /// Keys under one limit share the shard's one copy of it, in an image's state too; a
    /// limit no key holds any longer goes at the next eviction, so a client naming a limit
    /// of its own per key (inline) leaves no more limits than keys.
    #[test]
    fn keys_share_their_limit_and_unused_limits_go_at_eviction() {
        let mut s = ShardState::new(bounds(100));
        let l = Limit::new(Algorithm::Gcra, 10, SECOND, 10).unwrap();
        let checks = (0..10)
            .map(|i| check(&format!("k{i}"), &l, 1, None))
            .collect();
        s.apply(&Batch::at(1, checks));
        let copies = |s: &ShardState| {
            let mut counts: Vec<usize> = s.limits.0.iter().map(Arc::strong_count).collect();
            counts.sort();
            counts
        };
        // The set's reference and the ten keys'.
        assert_eq!(copies(&s), [11]);
        let restored = ShardState::from_image(&s.image(), bounds(100)).unwrap();
        assert_eq!(copies(&restored), [11]);
        for i in 0..10 {
            let own = Limit::new(Algorithm::Gcra, 11 + i, SECOND, 10).unwrap();
            s.apply(&Batch::at(
                2,
                vec![check(&format!("own{i}"), &own, 1, None)],
            ));
        }
        assert_eq!(copies(&s).len(), 11);
        // A key whose limit changes at every check holds one limit, not one a check.
        for i in 0..5 {
            let next = Limit::new(Algorithm::Gcra, 50 + i, SECOND, 10).unwrap();
            s.apply(&Batch::at(3, vec![check("own0", &next, 1, None)]));
        }
        assert_eq!(copies(&s).len(), 11);
        // Every bucket full again: every key evicted, and every limit with them.
        s.apply(&Batch::at(100 * SECOND, vec![Command::Evict]));
        assert_eq!((s.len(), copies(&s).len()), (0, 0));
    }

    #[test]
    fn denials_are_what_applying_would_answer_and_change_nothing() {
        let mut s = ShardState::new(bounds(10));
        let exhaust = Batch {
            time: 0,
            commands: vec![check("k", &tb(), 2, None)],
            later: Vec::new(),
            epoch: 0,
        };
        assert_eq!(decided(&s.apply(&exhaust)[0]).outcome, Outcome::Allowed);
        let digest = s.digest();
        // Denied now, and a cost the limit can never grant: both answered, as apply would.
        let denied = vec![check("k", &tb(), 1, None), check("new", &tb(), 3, None)];
        let early = s.denials(&denied, 0).expect("both are denials");
        assert_eq!(s.digest(), digest, "a denial must not change the state");
        assert_eq!(s.len(), 1);
        let applied = s.clone().apply(&Batch {
            time: 0,
            commands: denied,
            later: Vec::new(),
            epoch: 0,
        });
        assert_eq!(early, applied);
        assert_eq!(decided(&early[1]).outcome, Outcome::Never);
        // Not answered early: one admission in the lot, a request id, a refund; or a time
        // at which the bucket has refilled.
        let mixed = vec![check("k", &tb(), 1, None), check("other", &tb(), 1, None)];
        assert_eq!(s.denials(&mixed, 0), None);
        assert_eq!(s.denials(&[check("k", &tb(), 1, Some("r"))], 0), None);
        let refund = Command::Refund {
            key: "k".into(),
            limit: tb(),
            cost: 1,
            admitted_at: 0,
            request_id: None,
            epoch: 0,
        };
        assert_eq!(s.denials(&[refund], 0), None);
        assert_eq!(s.denials(&[check("k", &tb(), 1, None)], SECOND), None);
        // A key stored under another limit (a reload): applying would record the new limit,
        // which eviction judges the key by, so the check must go through the log.
        let smaller = Limit::new(Algorithm::TokenBucket, 1, SECOND, 1).unwrap();
        let applied = s.clone().apply(&Batch {
            time: 0,
            commands: vec![check("k", &smaller, 1, None)],
            later: Vec::new(),
            epoch: 0,
        });
        assert_eq!(decided(&applied[0]).outcome, Outcome::Denied);
        assert_eq!(s.denials(&[check("k", &smaller, 1, None)], 0), None);
    }

    #[test]
    fn a_reload_that_lengthens_a_window_keeps_the_count_in_the_current_window() {
        let short = Limit::new(Algorithm::FixedWindow, 2, SECOND, 2).unwrap();
        let long = Limit::new(Algorithm::FixedWindow, 2, 60 * SECOND, 2).unwrap();
        let mut s = ShardState::new(bounds(10));
        let start = 1_000_000 * SECOND;
        let at = |t, l: &Limit| Batch {
            time: t,
            commands: vec![check("k", l, 2, None)],
            later: Vec::new(),
            epoch: 0,
        };
        assert!(decided(&s.apply(&at(start, &short))[0]).allowed());
        // The spent count stays (no fresh allowance), for this long window only.
        let d = decided(&s.apply(&at(start + 1, &long))[0]);
        assert_eq!(d.outcome, Outcome::Denied);
        assert!(d.retry_after <= 60 * SECOND, "{d:?}");
        assert!(decided(&s.apply(&at(start + 1 + d.retry_after, &long))[0]).allowed());
    }

    /// A reload that lowers a GCRA's rate on a shard a month old carries the key's debt over
    /// in the new units: the denial says "retry in one interval at the new rate", and a retry
    /// then is admitted (the stored time was read at the new scale: denied for a month).
    #[test]
    fn a_reload_that_lowers_a_rate_carries_the_keys_debt_over() {
        let fast = Limit::new(Algorithm::Gcra, 10, SECOND, 10).unwrap();
        let slow = Limit::new(Algorithm::Gcra, 5, SECOND, 10).unwrap();
        let start = 30 * 24 * 3600 * SECOND;
        let mut s = ShardState::new(bounds(10));
        let at = |t, l: &Limit| Batch::at(t, vec![check("k", l, 1, None)]);
        for _ in 0..10 {
            assert!(decided(&s.apply(&at(start, &fast))[0]).allowed());
        }
        let d = decided(&s.apply(&at(start, &slow))[0]);
        assert_eq!((d.outcome, d.retry_after), (Outcome::Denied, SECOND / 5));
        let retry = decided(&s.apply(&at(start + d.retry_after, &slow))[0]);
        assert!(retry.allowed(), "{retry:?}");
    }

    /// A refund names the limit its admission was decided under; once a reload has changed
    /// the key's limit, the key's state is in the new limit's units, and the refund gives
    /// nothing back (read in the old units, this refund of one unit gave all ten back).
    #[test]
    fn a_refund_under_a_limit_the_key_no_longer_has_gives_nothing_back() {
        let old = Limit::new(Algorithm::TokenBucket, 600, 60 * SECOND, 10).unwrap();
        let new = Limit::new(Algorithm::TokenBucket, 10, SECOND, 10).unwrap();
        let start = 1_000 * SECOND;
        let mut s = ShardState::new(bounds(10));
        assert!(
            decided(&s.apply(&Batch::at(start, vec![check("k", &old, 10, None)]))[0]).allowed()
        );
        // A check under the reloaded limit (a peek) moves the key to it.
        let peek = |s: &mut ShardState| {
            decided(&s.apply(&Batch::at(start, vec![check("k", &new, 0, None)]))[0]).remaining
        };
        assert_eq!(peek(&mut s), 0);
        s.apply(&Batch::at(
            start,
            vec![Command::Refund {
                key: "k".into(),
                limit: old,
                cost: 1,
                admitted_at: start,
                request_id: None,
                epoch: 0,
            }],
        ));
        assert_eq!(peek(&mut s), 0);
    }

    #[test]
    fn a_retry_with_the_same_request_id_gets_the_first_answer_and_consumes_nothing() {
        let mut s = ShardState::new(bounds(10));
        let b = |t, id| Batch {
            time: t,
            commands: vec![check("k", &tb(), 1, Some(id))],
            later: Vec::new(),
            epoch: 0,
        };
        let first = s.apply(&b(0, "r1"));
        let again = s.apply(&b(1, "r1"));
        assert_eq!(decided(&first[0]), decided(&again[0]));
        assert!(matches!(again[0], Applied::Decided { replayed: true, .. }));
        // Only one token was spent: one is left.
        let peek = s.apply(&Batch {
            time: 1,
            commands: vec![check("k", &tb(), 0, None)],
            later: Vec::new(),
            epoch: 0,
        });
        assert_eq!(decided(&peek[0]).remaining, 1);
    }

    #[test]
    fn an_image_restores_the_same_state_and_the_same_answers() {
        let mut s = ShardState::new(bounds(10));
        for (t, key) in [(0, "a"), (1, "b"), (2, "a")] {
            s.apply(&Batch {
                time: t,
                commands: vec![check(key, &tb(), 1, Some(&format!("{key}{t}")))],
                later: Vec::new(),
                epoch: 0,
            });
        }
        let copy = ShardState::from_image(&s.image(), bounds(10)).unwrap();
        assert_eq!(copy.image().len(), s.image().len());
        assert_eq!(copy.digest(), s.digest());
        let next = |st: &mut ShardState| {
            st.apply(&Batch {
                time: 3,
                commands: vec![check("a", &tb(), 1, Some("a0")), check("b", &tb(), 2, None)],
                later: Vec::new(),
                epoch: 0,
            })
        };
        let mut copy = copy;
        assert_eq!(next(&mut copy), next(&mut s));
        assert!(ShardState::from_image(b"\xff\x01", bounds(10)).is_err());
    }

    #[test]
    fn a_request_id_is_forgotten_after_the_horizon() {
        let mut s = ShardState::new(bounds(10));
        s.apply(&Batch {
            time: 0,
            commands: vec![check("k", &tb(), 1, Some("r"))],
            later: Vec::new(),
            epoch: 0,
        });
        let later = s.apply(&Batch {
            time: 11 * SECOND,
            commands: vec![check("k", &tb(), 1, Some("r"))],
            later: Vec::new(),
            epoch: 0,
        });
        assert!(matches!(
            later[0],
            Applied::Decided {
                replayed: false,
                ..
            }
        ));
    }

    #[test]
    fn at_the_key_cap_new_keys_get_the_fallback_and_existing_keys_keep_working() {
        let mut s = ShardState::new(bounds(1));
        s.apply(&Batch {
            time: 0,
            commands: vec![check("a", &tb(), 1, None)],
            later: Vec::new(),
            epoch: 0,
        });
        let r = s.apply(&Batch {
            time: 0,
            commands: vec![check("b", &tb(), 1, None), check("a", &tb(), 1, None)],
            later: Vec::new(),
            epoch: 0,
        });
        assert!(matches!(
            r[0],
            Applied::Decided {
                fallback: Fallback::KeyCap,
                ..
            }
        ));
        assert!(!decided(&r[0]).allowed());
        assert!(decided(&r[1]).allowed());
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn peeks_and_denials_of_new_keys_store_nothing() {
        let mut s = ShardState::new(bounds(10));
        s.apply(&Batch {
            time: 0,
            commands: vec![check("a", &tb(), 0, None), check("b", &tb(), 3, None)],
            later: Vec::new(),
            epoch: 0,
        });
        assert!(s.is_empty());
    }

    #[test]
    fn eviction_drops_only_keys_that_are_as_if_never_seen() {
        let mut s = ShardState::new(bounds(10));
        s.apply(&Batch {
            time: 0,
            commands: vec![check("a", &tb(), 2, None)],
            later: Vec::new(),
            epoch: 0,
        });
        s.apply(&Batch {
            time: SECOND,
            commands: vec![check("b", &tb(), 2, None)],
            later: Vec::new(),
            epoch: 0,
        });
        // At 2 s, "a" has refilled both tokens (fresh); "b" still misses one.
        let r = s.apply(&Batch {
            time: 2 * SECOND,
            commands: vec![Command::Evict],
            later: Vec::new(),
            epoch: 0,
        });
        assert_eq!(r[0], Applied::Evicted(1));
        assert_eq!(s.len(), 1);
        let d = s.apply(&Batch {
            time: 2 * SECOND,
            commands: vec![check("b", &tb(), 0, None)],
            later: Vec::new(),
            epoch: 0,
        });
        assert_eq!(decided(&d[0]).remaining, 1, "b kept its state");
    }

    #[test]
    fn a_refund_gives_back_what_was_admitted() {
        let mut s = ShardState::new(bounds(10));
        s.apply(&Batch {
            time: 5,
            commands: vec![check("a", &tb(), 2, None)],
            later: Vec::new(),
            epoch: 0,
        });
        s.apply(&Batch {
            time: 5,
            commands: vec![Command::Refund {
                key: "a".into(),
                limit: tb(),
                cost: 2,
                admitted_at: 5,
                request_id: None,
                epoch: 0,
            }],
            later: Vec::new(),
            epoch: 0,
        });
        let d = s.apply(&Batch {
            time: 5,
            commands: vec![check("a", &tb(), 2, None)],
            later: Vec::new(),
            epoch: 0,
        });
        assert!(decided(&d[0]).allowed());
    }

    /// A refund naming a request id gives the admission remembered under it back once,
    /// however often it comes (a retry of a denied check refunds its replayed admission
    /// again), and only if it names that admission (key, cost and the time the replay
    /// reported); a snapshot keeps that it was given back; a repeat of the id then answers a
    /// denial; and an id the shard does not hold gives nothing back (its admission is not in
    /// this state: a failover lost it, or it is past the horizon).
    #[test]
    fn a_refund_under_a_request_id_gives_its_admission_back_once() {
        let refund = |key: &str, cost: u64, id: &str, at: Nanos| Command::Refund {
            key: key.into(),
            limit: tb(),
            cost,
            admitted_at: at,
            request_id: Some(id.into()),
            epoch: 0,
        };
        let remaining = |s: &mut ShardState, key: &str| {
            decided(&s.apply(&Batch::at(9, vec![check(key, &tb(), 0, None)]))[0]).remaining
        };
        let mut s = ShardState::new(bounds(10));
        let first = s.apply(&Batch::at(5, vec![check("a", &tb(), 1, Some("r#0"))]));
        assert!(decided(&first[0]).allowed());
        // A retry's replay names the first decision's time.
        let replay = s.apply(&Batch::at(9, vec![check("a", &tb(), 1, Some("r#0"))]));
        assert!(matches!(
            replay[0],
            Applied::Decided {
                replayed: true,
                at: 5,
                ..
            }
        ));
        assert_eq!(remaining(&mut s, "a"), 1);
        // Not this admission: another time, cost or key (a retry that named other items).
        s.apply(&Batch::at(9, vec![check("b", &tb(), 1, None)]));
        s.apply(&Batch::at(
            9,
            vec![
                refund("a", 1, "r#0", 9),
                refund("a", 2, "r#0", 5),
                refund("b", 1, "r#0", 5),
            ],
        ));
        assert_eq!((remaining(&mut s, "a"), remaining(&mut s, "b")), (1, 1));
        s.apply(&Batch::at(9, vec![refund("a", 1, "r#0", 5)]));
        assert_eq!(remaining(&mut s, "a"), 2, "given back");
        // A repeat of the id is a denial now, as its check was answered.
        let again = s.apply(&Batch::at(9, vec![check("a", &tb(), 1, Some("r#0"))]));
        assert!(!decided(&again[0]).allowed());
        // Spend it again, then refund the id twice more (once after a snapshot): nothing.
        s.apply(&Batch::at(9, vec![check("a", &tb(), 1, Some("other#0"))]));
        s.apply(&Batch::at(9, vec![refund("a", 1, "r#0", 5)]));
        let mut restored = ShardState::from_image(&s.image(), bounds(10)).unwrap();
        restored.apply(&Batch::at(9, vec![refund("a", 1, "r#0", 5)]));
        assert_eq!(remaining(&mut s, "a"), 1, "a second refund gave back again");
        assert_eq!(
            remaining(&mut restored, "a"),
            1,
            "the snapshot forgot the refund"
        );
        // An id never decided here (or past the horizon) gives nothing back.
        s.apply(&Batch::at(9, vec![refund("a", 1, "lost#0", 9)]));
        assert_eq!(remaining(&mut s, "a"), 1);
        // A denial under an id has nothing to give back either.
        s.apply(&Batch::at(9, vec![check("a", &tb(), 2, Some("denied#1"))]));
        s.apply(&Batch::at(9, vec![refund("a", 2, "denied#1", 9)]));
        assert_eq!(remaining(&mut s, "a"), 1);
    }

    /// A refund without a request id gives back only in an entry of the epoch (leadership)
    /// whose entry made the admission: one of another may have been a fast admission that a
    /// failover lost, which this state does not hold.
    #[test]
    fn a_refund_without_a_request_id_gives_back_only_in_its_admissions_epoch() {
        let refund = |epoch: u64| Command::Refund {
            key: "a".into(),
            limit: tb(),
            cost: 1,
            admitted_at: 5,
            request_id: None,
            epoch,
        };
        let in_epoch = |epoch: u64, commands: Vec<Command>| {
            let mut b = Batch::at(5, commands);
            b.epoch = epoch;
            b
        };
        let mut s = ShardState::new(bounds(10));
        let first = s.apply(&in_epoch(7, vec![check("a", &tb(), 1, None)]));
        assert!(matches!(first[0], Applied::Decided { epoch: 7, .. }));
        let remaining = |s: &ShardState| {
            decided(
                &s.clone()
                    .apply(&Batch::at(5, vec![check("a", &tb(), 0, None)]))[0],
            )
            .remaining
        };
        assert_eq!(remaining(&s), 1);
        let mut other = s.clone();
        other.apply(&in_epoch(8, vec![refund(7)]));
        assert_eq!(remaining(&other), 1, "a refund in another epoch gave back");
        s.apply(&in_epoch(7, vec![refund(7)]));
        assert_eq!(remaining(&s), 2);
    }

    /// An entry gathered in parts (the proposer's open entry) applies each part at its own
    /// time, as the leader decided it: the same answers and state as one batch per part,
    /// and a part after a window boundary counts in the new window.
    #[test]
    fn a_batch_in_parts_applies_each_part_at_its_time() {
        let window = Limit::new(Algorithm::FixedWindow, 2, SECOND, 2).unwrap();
        let parts = [
            (SECOND - 10, vec![check("w", &window, 2, None)]),
            (SECOND - 5, vec![check("w", &window, 1, None)]),
            (
                SECOND + 5,
                vec![check("w", &window, 2, None), check("t", &tb(), 1, None)],
            ),
        ];
        let mut one = ShardState::new(bounds(10));
        let mut each = ShardState::new(bounds(10));
        let mut batch = Batch::at(parts[0].0, Vec::new());
        let mut expected = Vec::new();
        for (t, commands) in &parts {
            batch.push_part(*t, commands.clone());
            expected.extend(each.apply(&Batch::at(*t, commands.clone())));
        }
        assert_eq!(batch.later.len(), 2);
        let applied = one.apply(&Batch::decode(&batch.encode()).unwrap());
        assert_eq!(applied, expected);
        let outcomes: Vec<bool> = applied.iter().map(|a| decided(a).allowed()).collect();
        // Full at SECOND - 10, denied at SECOND - 5, a new window at SECOND + 5.
        assert_eq!(outcomes, [true, false, true, true]);
        let ats: Vec<Nanos> = applied
            .iter()
            .map(|a| match a {
                Applied::Decided { at, .. } => *at,
                other => panic!("not a decision: {other:?}"),
            })
            .collect();
        assert_eq!(ats, [SECOND - 10, SECOND - 5, SECOND + 5, SECOND + 5]);
        assert_eq!(one.digest(), each.digest());
        assert_eq!(one.time(), batch.last_time());
        // Read as one time (the format without parts), the boundary would be missed.
        let mut flat = ShardState::new(bounds(10));
        let flat_applied = flat.apply(&Batch::at(batch.time, batch.commands.clone()));
        assert!(!decided(&flat_applied[2]).allowed());
    }

    /// A shared copy ([`ShardState::share`], what a fast leader's speculative state starts
    /// from) answers as the original does, and what either applies leaves the other as it
    /// was; an image taken off a shared copy is the original's image, byte for byte.
    #[test]
    fn a_shared_copy_answers_as_the_original_and_neither_sees_the_others_applies() {
        let mut a = ShardState::new(bounds(100_000));
        let keys: Vec<String> = (0..5_000).map(|i| format!("key-{i}")).collect();
        let batch = |t: u64, from: usize, ids: bool| {
            let commands = keys[from..from + 1_000]
                .iter()
                .enumerate()
                .map(|(i, k)| check(k, &tb(), 1, ids.then(|| format!("{t}-{i}")).as_deref()))
                .collect();
            Batch::at(t, commands)
        };
        for (t, from) in [(1, 0), (2, 1_000), (3, 2_000)] {
            a.apply(&batch(t, from, true));
        }
        let image = a.image();
        assert_eq!(a.pending_image().encode(), image);
        let before = a.digest();
        let mut b = a.share();
        assert_eq!(b.digest(), before);
        // The same batches on both: the same answers and states.
        for (t, from) in [(4, 500), (5, 2_500)] {
            assert_eq!(
                a.apply(&batch(t, from, true)),
                b.apply(&batch(t, from, true))
            );
        }
        assert_eq!(a.digest(), b.digest());
        // Each side's own applies: the other stays as it was.
        let (after_a, after_b) = (a.digest(), b.digest());
        let mut c = a.share();
        c.apply(&batch(6, 3_000, false));
        c.apply(&Batch::at(60_000_000_000, vec![Command::Evict]));
        assert_eq!(c.len(), 0);
        assert_eq!((a.digest(), a.len()), (after_a, 3_500));
        b.apply(&batch(6, 4_000, true));
        assert_eq!(a.digest(), after_a);
        assert_ne!(b.digest(), after_b);
        assert_ne!(before, after_a);
        // The first state's image still decodes to it.
        let restored = ShardState::from_image(&image, bounds(100_000)).unwrap();
        assert_eq!(restored.digest(), before);
    }

    /// A snapshot's image is the state as of when it was taken: what the shard applies while
    /// it is encoded (ids remembered and forgotten, a refund that turns a remembered
    /// admission into a denial) is not in it, though the ids share their chunks with it.
    #[test]
    fn a_pending_image_is_the_state_when_it_was_taken() {
        let mut s = ShardState::new(bounds(10_000));
        let checks = |ids: std::ops::Range<u64>| {
            let check_id = |i| check(&format!("k{i}"), &tb(), 1, Some(&format!("r{i}")));
            ids.map(check_id).collect::<Vec<_>>()
        };
        s.apply(&Batch::at(5, checks(0..900)));
        let image = s.image();
        let pending = s.pending_image();
        let refund = Command::Refund {
            key: "k600".into(),
            limit: tb(),
            cost: 1,
            admitted_at: 5,
            request_id: Some("r600".into()),
            epoch: 0,
        };
        s.apply(&Batch::at(6, vec![refund]));
        // 600 more ids, past the cap of 1,000: the 500 oldest are forgotten.
        s.apply(&Batch::at(7, checks(900..1_500)));
        let repeat =
            |s: &mut ShardState, id: u64| decided(&s.apply(&Batch::at(8, checks(id..id + 1)))[0]);
        assert!(!repeat(&mut s, 600).allowed(), "refunded: a denial now");
        assert!(repeat(&mut s, 3).allowed(), "forgotten: decided again");
        assert_eq!(pending.encode(), image);
        let mut restored = ShardState::from_image(&image, bounds(10_000)).unwrap();
        assert!(
            repeat(&mut restored, 600).allowed(),
            "remembered as admitted"
        );
        assert_eq!(restored.ids.len(), 900);
        assert_eq!(s.ids.len(), 1_000);
    }

    /// Images are not sorted: the digest, not the bytes, says two states are equal. Keys
    /// inserted in another order, and a state restored from an image, digest the same (each
    /// table's own random seed orders its keys too); a key's state, a key more, or a request
    /// id more do not.
    #[test]
    fn the_digest_tells_states_apart_whatever_the_key_order() {
        let keys: Vec<String> = (0..200).map(|i| format!("key-{i}")).collect();
        let fill = |order: &mut dyn Iterator<Item = &String>| {
            let mut s = ShardState::new(bounds(1000));
            let commands = order.map(|k| check(k, &tb(), 1, None)).collect();
            s.apply(&Batch::at(5, commands));
            s
        };
        let a = fill(&mut keys.iter());
        let b = fill(&mut keys.iter().rev());
        assert_eq!(a.digest(), b.digest());
        let restored = ShardState::from_image(&b.image(), bounds(1000)).unwrap();
        assert_eq!(restored.digest(), a.digest());
        let mut more = fill(&mut keys.iter());
        more.apply(&Batch::at(5, vec![check("key-7", &tb(), 1, None)]));
        assert_ne!(more.digest(), a.digest(), "a key's state differs");
        let mut extra = fill(&mut keys.iter());
        extra.apply(&Batch::at(5, vec![check("another", &tb(), 1, None)]));
        assert_ne!(extra.digest(), a.digest(), "a key more");
        let mut id = fill(&mut keys.iter());
        id.apply(&Batch::at(5, vec![check("key-7", &tb(), 0, Some("r1"))]));
        assert_ne!(id.digest(), a.digest(), "a request id more");
    }

    /// Two keys' counts swapped (an admission on the wrong key) change the digest: each
    /// pair differs only in the last byte of two keys' encodings.
    #[test]
    fn the_digest_tells_swapped_counts_apart() {
        let window = Limit::new(Algorithm::FixedWindow, 100, 60 * SECOND, 100).unwrap();
        let state = |costs: &[(String, u64)]| {
            let mut s = ShardState::new(bounds(100));
            let commands = costs
                .iter()
                .map(|(k, c)| check(k, &window, *c, None))
                .collect();
            s.apply(&Batch::at(5, commands));
            s
        };
        for pair in 0..16 {
            // Keys of the same bit parity: unmixed, FNV-1a's sums of such a pair's two
            // states are equal (the low bit of its state before the last byte is theirs).
            let (a, b) = (format!("a{pair}"), format!("c{pair}"));
            let x = state(&[(a.clone(), 2), (b.clone(), 3)]);
            let y = state(&[(a.clone(), 3), (b.clone(), 2)]);
            assert_ne!(
                x.digest(),
                y.digest(),
                "{a} and {b} with their counts swapped"
            );
        }
    }

    #[test]
    fn replicas_applying_the_same_batches_reach_the_same_digest() {
        let batches: Vec<Batch> = (0..50)
            .map(|i| Batch {
                time: i * 100_000_000,
                commands: vec![
                    check(&format!("k{}", i % 7), &tb(), 1 + i % 2, None),
                    Command::Evict,
                ],
                later: Vec::new(),
                epoch: 0,
            })
            .collect();
        let (mut a, mut b) = (ShardState::new(bounds(100)), ShardState::new(bounds(100)));
        for batch in &batches {
            let decoded = Batch::decode(&batch.encode()).unwrap();
            assert_eq!(a.apply(batch), b.apply(&decoded));
        }
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), ShardState::new(bounds(100)).digest());
    }

    #[test]
    fn shard_time_never_runs_backwards() {
        let mut s = ShardState::new(bounds(10));
        s.apply(&Batch {
            time: 100,
            commands: vec![],
            later: Vec::new(),
            epoch: 0,
        });
        s.apply(&Batch {
            time: 50,
            commands: vec![],
            later: Vec::new(),
            epoch: 0,
        });
        assert_eq!(s.time(), 100);
    }

    #[test]
    fn the_member_history_keeps_every_id_that_left() {
        let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
        let mut s = ShardState::new(bounds(10));
        s.note_membership(&set(&[]), &set(&[1, 2, 3]));
        // A learner added, made a voter, then node 1 removed.
        s.note_membership(&set(&[1, 2, 3]), &set(&[1, 2, 3, 4]));
        s.note_membership(&set(&[1, 2, 3, 4]), &set(&[2, 3, 4]));
        assert_eq!(s.members().removed, set(&[1]));
        // The history is in the image (snapshots).
        s.note_membership(&set(&[2, 3, 4]), &set(&[2, 3]));
        assert_eq!(s.members().removed, set(&[1, 4]));
        let copy = ShardState::from_image(&s.image(), bounds(10)).unwrap();
        assert_eq!(copy.members(), s.members());
        assert_ne!(copy.digest(), ShardState::new(bounds(10)).digest());
    }
}
