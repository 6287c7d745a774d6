//! A shard's key table, copy-on-write in parts: a copy of the table ([`KeyTable::share`])
//! shares every part with the original, and each side copies a part only when it first
//! changes it.
//!
//! Two copies of a shard's state are taken while it serves: a snapshot's (its image is
//! encoded while the shard applies on), and a fast leader's speculative state (the
//! committed state, then each entry it proposes). A plain map made either one a copy or an
//! encoding of every key under the state machine's lock, when no entry of the shard could
//! apply: about 12 ms per 100,000 keys to copy, 5-8 ms to encode (`cargo bench --bench
//! apply -- image`), so a few tenths of a second for a shard of millions of keys. Split into
//! parts (up to 4,096), a copy is a reference count per part, and an apply after it copies
//! at most the parts its checks change (one per key, at most [`SPLIT_ABOVE`] keys each
//! until the table has 4,096 parts).
//!
//! A part the table has to itself is held inline, not behind an `Arc`, so changing it
//! needs no uniqueness check (an atomic operation or two; not measurably slower, but a table
//! never copied, as a single node's, has no use for one). [`KeyTable::share`] moves each
//! part into an `Arc` for both sides; the first change of a shared part takes it back
//! (copied if the other side still has it).

use compact_str::CompactString;
use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::sync::Arc;

/// One part's keys and values, found by the key's hash ([`KeyTable`] hashes a key once:
/// some of its bits choose the part, [`slot`]). A key of up to 24 bytes is held in the
/// entry itself, with no allocation of its own (`CompactString`).
pub type Part<V> = HashTable<(CompactString, V)>;

/// A part, the table's own or shared with copies.
#[derive(Debug, Clone)]
pub enum PartRef<V> {
    Own(Part<V>),
    Shared(Arc<Part<V>>),
}

impl<V> std::ops::Deref for PartRef<V> {
    type Target = Part<V>;

    fn deref(&self) -> &Part<V> {
        match self {
            PartRef::Own(part) => part,
            PartRef::Shared(part) => part,
        }
    }
}

impl<V: Clone> PartRef<V> {
    /// The part to change: a shared one is taken back first, copied if a copy of the
    /// table still has it.
    fn own(&mut self) -> &mut Part<V> {
        if matches!(self, PartRef::Shared(_)) {
            if let PartRef::Shared(shared) = std::mem::replace(self, PartRef::Own(Part::new())) {
                *self = PartRef::Own(Arc::unwrap_or_clone(shared));
            }
        }
        // Own by now; a shared part would be made so here too.
        match self {
            PartRef::Own(part) => part,
            PartRef::Shared(shared) => Arc::make_mut(shared),
        }
    }

    /// This part as shared, and a reference to it for a copy.
    fn share(&mut self) -> PartRef<V> {
        if matches!(self, PartRef::Own(_)) {
            if let PartRef::Own(part) = std::mem::replace(self, PartRef::Own(Part::new())) {
                *self = PartRef::Shared(Arc::new(part));
            }
        }
        self.clone()
    }
}

/// Bits of a key's hash that can choose its part: at most [`SLOTS`] parts.
const SLOT_BITS: u32 = 12;
const SLOTS: usize = 1 << SLOT_BITS;

/// A part splits in two when it holds more keys than this (until there are [`SLOTS`]
/// parts, at about half a million keys): what an apply after a copy may have to copy for
/// each key it changes. Beyond that the parts grow (about 800 keys each at a shard's share
/// of the default `max_keys`, 10 million over three shards).
const SPLIT_ABOVE: usize = 128;

/// Which slots a part holds: the keys whose [`slot`] is in
/// `first .. first + (SLOTS >> depth)`.
#[derive(Debug, Clone, Copy)]
struct Span {
    first: u16,
    depth: u8,
}

/// Keys to values, in parts shared between copies until changed: extendible hashing, a
/// directory of [`SLOTS`] slots, each naming the part its keys are in.
#[derive(Debug, Clone)]
pub struct KeyTable<V> {
    /// Slot to part (an index into `parts`); changes only when a part splits.
    dir: Arc<[u16; SLOTS]>,
    parts: Vec<PartRef<V>>,
    spans: Vec<Span>,
    /// Randomly seeded: an outsider cannot choose keys that fall into one part.
    hasher: foldhash::fast::RandomState,
    len: usize,
}

impl<V: Clone> Default for KeyTable<V> {
    fn default() -> Self {
        KeyTable {
            dir: Arc::new([0; SLOTS]),
            parts: vec![PartRef::Own(Part::new())],
            spans: vec![Span { first: 0, depth: 0 }],
            hasher: foldhash::fast::RandomState::default(),
            len: 0,
        }
    }
}

/// A key's slot: [`SLOT_BITS`] bits of its hash below the top 7, which hashbrown keeps as
/// each entry's tag (to tell keys apart before comparing them), and above the low bits,
/// which place the entry in its part. (Taken from the top bits, every key of a part split
/// 7 or more times had the same tag, and each lookup compared the key with every entry it
/// probed.)
fn slot(hash: u64) -> usize {
    ((hash >> (u64::BITS - 7 - SLOT_BITS)) as usize) & (SLOTS - 1)
}

impl<V: Clone> KeyTable<V> {
    /// The key's hash and the index of its part.
    fn find(&self, key: &str) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, usize::from(self.dir[slot(hash)]))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        let (hash, i) = self.find(key);
        let found = self.parts[i].find(hash, |(k, _)| k == key);
        found.map(|(_, v)| v)
    }

    /// The value of `key` to change; its part is taken back first if it is shared (not
    /// for a key the part does not hold).
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let (hash, i) = self.find(key);
        let is_key = |(k, _): &(CompactString, V)| k == key;
        let part = &mut self.parts[i];
        if let PartRef::Shared(shared) = part {
            shared.find(hash, is_key)?;
        }
        let found = part.own().find_mut(hash, |e| is_key(e));
        found.map(|(_, v)| v)
    }

    pub fn insert(&mut self, key: CompactString, value: V) -> Option<V> {
        let (hash, i) = self.find(&key);
        let hasher = &self.hasher;
        let part = self.parts[i].own();
        match part.entry(hash, |(k, _)| *k == key, |(k, _)| hasher.hash_one(k)) {
            Entry::Occupied(mut e) => Some(std::mem::replace(&mut e.get_mut().1, value)),
            Entry::Vacant(e) => {
                e.insert((key, value));
                self.len += 1;
                if part.len() > SPLIT_ABOVE {
                    self.split(i);
                }
                None
            }
        }
    }

    /// Splits part `i` in two, unless it holds one slot: the upper half of its slots and
    /// their keys go to a new part.
    fn split(&mut self, i: usize) {
        let span = self.spans[i];
        let depth = span.depth + 1;
        if u32::from(depth) > SLOT_BITS {
            return;
        }
        let half = SLOTS >> depth;
        let mid = usize::from(span.first) + half;
        let hasher = &self.hasher;
        let part = self.parts[i].own();
        let mut upper = Part::with_capacity(part.len() / 2);
        for (k, v) in part.extract_if(|(k, _)| slot(hasher.hash_one(&**k)) >= mid) {
            let hash = hasher.hash_one(&*k);
            upper.insert_unique(hash, (k, v), |(k, _)| hasher.hash_one(k));
        }
        part.shrink_to_fit(|(k, _)| hasher.hash_one(k));
        self.spans[i].depth = depth;
        let j = u16::try_from(self.parts.len()).expect("at most SLOTS parts");
        self.parts.push(PartRef::Own(upper));
        self.spans.push(Span {
            first: mid as u16,
            depth,
        });
        Arc::make_mut(&mut self.dir)[mid..mid + half].fill(j);
    }

    /// Keeps the keys `keep` says to (it must answer the same for a key asked twice);
    /// returns how many went. A shared part that keeps every key is not copied.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &V) -> bool) -> usize {
        let mut gone = 0;
        for part in &mut self.parts {
            // A shared part is looked through first: copied only if a key goes.
            let shared = matches!(part, PartRef::Shared(_));
            let keeps_all = shared && part.iter().all(|(k, v)| keep(k, v));
            if keeps_all {
                continue;
            }
            let part = part.own();
            let before = part.len();
            part.retain(|(k, v)| keep(k, v));
            gone += before - part.len();
        }
        self.len -= gone;
        gone
    }

    /// A copy that shares every part with this table (a reference count each): the first
    /// change of a part on either side takes it back, copying it if the other side still
    /// has it. (`clone` copies every part this table has to itself.)
    pub fn share(&mut self) -> KeyTable<V> {
        KeyTable {
            dir: self.dir.clone(),
            parts: self.parts.iter_mut().map(PartRef::share).collect(),
            spans: self.spans.clone(),
            hasher: self.hasher.clone(),
            len: self.len,
        }
    }

    /// Every key and value, part by part (an order of no meaning).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.part_refs()
            .flat_map(|p| p.iter().map(|(k, v)| (k.as_str(), v)))
    }

    /// The parts, in order.
    pub fn part_refs(&self) -> impl Iterator<Item = &Part<V>> {
        self.parts.iter().map(|p| &**p)
    }

    /// The parts, to read one at a time and drop each once read: a part no copy shares any
    /// longer is not copied when the table it came from changes it.
    pub fn into_parts(self) -> Vec<PartRef<V>> {
        self.parts
    }

    /// How many parts the table has (for tests).
    #[cfg(test)]
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// How many parts `self` and `other` share (a copy and its original: all until one
    /// side changes them; for tests).
    #[cfg(test)]
    pub fn shared_parts(&self, other: &Self) -> usize {
        let same = |(a, b): (&PartRef<V>, &PartRef<V>)| match (a, b) {
            (PartRef::Shared(a), PartRef::Shared(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        self.parts
            .iter()
            .zip(&other.parts)
            .filter(|&p| same(p))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(n: usize) -> KeyTable<u64> {
        let mut t = KeyTable::default();
        for i in 0..n {
            t.insert(format!("key-{i}").into(), i as u64);
        }
        t
    }

    fn contents(t: &KeyTable<u64>) -> Vec<(String, u64)> {
        let mut all: Vec<_> = t.iter().map(|(k, v)| (k.to_owned(), *v)).collect();
        all.sort();
        all
    }

    #[test]
    fn a_copy_shares_its_parts_until_one_side_changes_them() {
        let mut a = table(10_000);
        let mut b = a.share();
        let parts = a.parts();
        assert!(parts > 8, "{parts} parts");
        assert_eq!(a.shared_parts(&b), parts);
        // A miss copies nothing, nor does a read, nor a retain that keeps every key.
        assert!(b.get_mut("absent").is_none());
        assert_eq!(b.get("key-1"), Some(&1));
        assert_eq!(b.retain(|_, _| true), 0);
        assert_eq!(a.shared_parts(&b), parts);
        // A plain clone of a table that has its parts to itself shares none.
        let own = table(10_000);
        assert_eq!(own.shared_parts(&own.clone()), 0);
        *b.get_mut("key-1").unwrap() += 100;
        b.insert("new".into(), 7);
        // The original is as it was; the copy has its changes, in copies of their parts.
        assert_eq!(a.get("key-1"), Some(&1));
        assert_eq!(a.get("new"), None);
        assert_eq!((a.len(), b.len()), (10_000, 10_001));
        assert_eq!((b.get("key-1"), b.get("new")), (Some(&101), Some(&7)));
        let copied = parts - a.shared_parts(&b);
        assert!((1..=2).contains(&copied), "{copied} parts copied");
        // Once copied, a part is the side's own: changing it again copies nothing more.
        *b.get_mut("key-1").unwrap() += 1;
        assert_eq!(parts - a.shared_parts(&b), copied);
    }

    /// Parts split as keys go in: each part holds the keys of its slots, no more than
    /// `SPLIT_ABOVE` (but for a part of one slot), and the directory names it for them.
    #[test]
    fn parts_split_as_the_table_grows_and_every_key_stays_found() {
        let mut t = table(100);
        assert_eq!(t.parts(), 1);
        let copy = t.share();
        for i in 100..300_000 {
            t.insert(format!("key-{i}").into(), i);
        }
        assert!(t.parts() > 256 && t.parts() <= SLOTS, "{} parts", t.parts());
        for (i, (p, span)) in t.parts.iter().zip(&t.spans).enumerate() {
            let first = usize::from(span.first);
            let slots = first..first + (SLOTS >> span.depth);
            assert!(p.len() <= SPLIT_ABOVE || slots.len() == 1);
            assert!(t.dir[slots.clone()].iter().all(|&d| usize::from(d) == i));
            for (k, _) in p.iter() {
                assert!(slots.contains(&slot(t.hasher.hash_one(&**k))));
            }
        }
        let mut covered = vec![0; SLOTS];
        for span in &t.spans {
            let first = usize::from(span.first);
            covered[first..first + (SLOTS >> span.depth)]
                .iter_mut()
                .for_each(|c| *c += 1);
        }
        assert!(covered.iter().all(|&c| c == 1), "each slot in one part");
        assert_eq!(t.len(), 300_000);
        assert!((0..300_000).all(|i| t.get(&format!("key-{i}")) == Some(&i)));
        // The copy taken before the splits is as it was.
        assert_eq!((copy.parts(), copy.len()), (1, 100));
        assert_eq!(copy.get("key-99"), Some(&99));
        assert_eq!(copy.get("key-100"), None);
    }

    #[test]
    fn retain_and_insert_agree_with_a_plain_map_on_both_sides_of_a_copy() {
        let mut a = table(5_000);
        let mut b = a.share();
        let mut plain_a: std::collections::HashMap<String, u64> =
            a.iter().map(|(k, v)| (k.to_owned(), *v)).collect();
        let mut plain_b = plain_a.clone();
        assert_eq!(a.retain(|_, v| v % 3 != 0), 1_667);
        plain_a.retain(|_, v| *v % 3 != 0);
        assert_eq!(b.retain(|k, _| !k.ends_with('7')), 500);
        plain_b.retain(|k, _| !k.ends_with('7'));
        // Enough new keys on one side to split its parts after the copy.
        for i in 0..4_000u64 {
            let key = format!("key-{}", i * 37);
            a.insert(key.as_str().into(), i);
            plain_a.insert(key.clone(), i);
            if let Some(v) = b.get_mut(&key) {
                *v *= 2;
            }
            if let Some(v) = plain_b.get_mut(&key) {
                *v *= 2;
            }
        }
        for (t, plain) in [(&a, &plain_a), (&b, &plain_b)] {
            let mut want: Vec<_> = plain.iter().map(|(k, v)| (k.clone(), *v)).collect();
            want.sort();
            assert_eq!(contents(t), want);
            assert_eq!(t.len(), plain.len());
        }
    }
}
