//! A shard's remembered request ids: a queue of entries in the order they were remembered
//! (which is their expiry order), in chunks shared between copies until changed, and an
//! index from key to place in the queue.
//!
//! A snapshot takes a copy of the shard's state under the state machine's lock, when no
//! entry of the shard can apply. A map of ids to answers and a queue of expiry times made
//! that a copy of every id (2.2-2.6 ms at the default cap of 100,000, `cargo bench --bench
//! apply -- ids`). An image needs only the queue ([`IdTable::entries`]): a reference count
//! per chunk. A fast leader's speculative state needs the index too ([`IdTable::clone`]):
//! 24 bytes an entry (and the hash table's slack) in place of the whole answer.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Most entries per chunk: what a change after a copy may copy (a refund's, in the chunk
/// of the admission it names; an insert's, in the last chunk).
const CHUNK: usize = 256;

/// A chunk of the queue: entries `(expires, key, value)`.
type Chunk<K, V> = Arc<Vec<(u64, K, V)>>;

/// Keys to values, with their expiry times in the order they were remembered.
#[derive(Debug, Clone)]
pub struct IdTable<K, V> {
    /// Key to its entry's number. foldhash is several times faster than SipHash on short
    /// keys; its seed differs per process and per map, so a key set chosen offline does
    /// not collide here (foldhash itself claims only minimal resistance to an attacker who
    /// can probe a running node).
    index: HashMap<K, u64, foldhash::fast::RandomState>,
    queue: Entries<K, V>,
}

/// The queue of an [`IdTable`]: entries numbered from 0 as they were inserted, the live ones
/// `front .. next`. Entry `n` is at `chunks[n / CHUNK - front / CHUNK][n % CHUNK]`: the
/// first chunk is dropped once `front` leaves it.
#[derive(Debug, Clone)]
pub struct Entries<K, V> {
    chunks: VecDeque<Chunk<K, V>>,
    front: u64,
    next: u64,
}

impl<K, V> Default for IdTable<K, V> {
    fn default() -> Self {
        IdTable {
            index: HashMap::default(),
            queue: Entries {
                chunks: VecDeque::new(),
                front: 0,
                next: 0,
            },
        }
    }
}

impl<K, V> Entries<K, V> {
    fn place(&self, n: u64) -> (usize, usize) {
        (
            (n / CHUNK as u64 - self.front / CHUNK as u64) as usize,
            (n % CHUNK as u64) as usize,
        )
    }

    fn entry(&self, n: u64) -> &(u64, K, V) {
        let (chunk, i) = self.place(n);
        &self.chunks[chunk][i]
    }

    /// Every entry, oldest first: `(expires, key, value)`.
    pub fn iter(&self) -> impl Iterator<Item = &(u64, K, V)> {
        (self.front..self.next).map(|n| self.entry(n))
    }

    pub fn len(&self) -> usize {
        (self.next - self.front) as usize
    }
}

/// A chunk to change: copied first if a copy of the table still has it (with room for a
/// whole chunk, as the last chunk takes inserts).
fn own<T: Clone>(chunk: &mut Arc<Vec<T>>) -> &mut Vec<T> {
    if Arc::get_mut(chunk).is_none() {
        let mut copy = Vec::with_capacity(CHUNK);
        copy.extend_from_slice(chunk);
        *chunk = Arc::new(copy);
    }
    Arc::get_mut(chunk).expect("a chunk just made is this table's own")
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> IdTable<K, V> {
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        let n = *self.index.get(key)?;
        Some(&self.queue.entry(n).2)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let n = *self.index.get(key)?;
        let (chunk, i) = self.queue.place(n);
        Some(&mut own(&mut self.queue.chunks[chunk])[i].2)
    }

    /// Remembers `key` until `expires` (the queue's order: callers insert in time order). A
    /// key remembered already takes the new value and keeps its place and first expiry.
    pub fn insert(&mut self, expires: u64, key: K, value: V) {
        let q = &mut self.queue;
        match self.index.entry(key) {
            Entry::Occupied(at) => {
                let (chunk, i) = q.place(*at.get());
                own(&mut q.chunks[chunk])[i].2 = value;
                return;
            }
            Entry::Vacant(at) => {
                at.insert(q.next);
            }
        }
        if q.next % CHUNK as u64 == 0 {
            q.chunks.push_back(Arc::new(Vec::with_capacity(CHUNK)));
        }
        let last = q
            .chunks
            .back_mut()
            .expect("a chunk has room for entry `next`");
        own(last).push((expires, key, value));
        q.next += 1;
    }

    /// The expiry time of the oldest entry.
    pub fn oldest(&self) -> Option<u64> {
        let q = &self.queue;
        (q.front < q.next).then(|| q.entry(q.front).0)
    }

    /// Forgets the oldest entry.
    pub fn forget_oldest(&mut self) {
        let q = &mut self.queue;
        if q.front == q.next {
            return;
        }
        self.index.remove(&q.entry(q.front).1);
        q.front += 1;
        if q.front % CHUNK as u64 == 0 {
            q.chunks.pop_front();
        }
    }

    /// The entries as of now, oldest first, for an image: a reference count per chunk.
    pub fn entries(&self) -> Entries<K, V> {
        self.queue.clone()
    }

    /// How many of this table's chunks are shared with `other`'s (what a test measures a
    /// copy by; chunks are paired by position, so only while neither side has dropped one).
    #[cfg(test)]
    fn shared_with(&self, other: &Entries<K, V>) -> usize {
        let pairs = self.queue.chunks.iter().zip(other.chunks.iter());
        pairs.filter(|(a, b)| Arc::ptr_eq(a, b)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: u64) -> IdTable<u64, u64> {
        let mut r = IdTable::default();
        for k in 0..n {
            r.insert(k + 100, k, k * 10);
        }
        r
    }

    fn keys(entries: &Entries<u64, u64>) -> Vec<u64> {
        entries.iter().map(|(_, k, _)| *k).collect()
    }

    #[test]
    fn entries_are_found_and_forgotten_oldest_first() {
        let mut r = filled(1000);
        assert_eq!(r.len(), 1000);
        assert_eq!(r.get(&999), Some(&9990));
        assert_eq!(r.oldest(), Some(100));
        for _ in 0..600 {
            r.forget_oldest();
        }
        assert_eq!(r.len(), 400);
        // Chunks 0 and 1 (entries 0-511) are dropped: 512-767 and 768-999 are left.
        assert_eq!(r.queue.chunks.len(), 2);
        assert_eq!((r.get(&599), r.get(&600)), (None, Some(&6000)));
        assert_eq!(r.oldest(), Some(700));
        assert_eq!(keys(&r.entries()), (600..1000).collect::<Vec<_>>());
        *r.get_mut(&700).unwrap() = 7;
        assert_eq!(r.get(&700), Some(&7));
        assert!(r.get_mut(&10).is_none());
        // Again: a new value in the old place.
        r.insert(5000, 650, 1);
        assert_eq!((r.len(), r.get(&650)), (400, Some(&1)));
        let expires =
            |r: &IdTable<u64, u64>, key| r.entries().iter().find(|e| e.1 == key).map(|e| e.0);
        assert_eq!(expires(&r, 650), Some(750));
        assert_eq!(keys(&r.entries()), (600..1000).collect::<Vec<_>>());
        for _ in 0..500 {
            r.forget_oldest();
        }
        assert_eq!(
            (r.len(), r.oldest(), r.entries().iter().count()),
            (0, None, 0)
        );
        // Emptied in the middle of a chunk, then filled again past its end.
        let mut r = filled(300);
        for _ in 0..300 {
            r.forget_oldest();
        }
        for k in 0..300 {
            r.insert(k, k + 1000, k);
        }
        assert_eq!(keys(&r.entries()), (1000..1300).collect::<Vec<_>>());
        assert_eq!((r.len(), r.get(&1299)), (300, Some(&299)));
    }

    /// What an image takes shares every chunk; a change after it copies only the chunk it
    /// changes, and the image does not see it.
    #[test]
    fn an_images_entries_share_chunks_until_the_table_changes_one() {
        let mut a = filled(1000);
        let chunks = 1000usize.div_ceil(CHUNK);
        let image = a.entries();
        assert_eq!(a.shared_with(&image), chunks);
        a.insert(9000, 9000, 1);
        // The last chunk is copied (to take the insert); the rest is still shared.
        assert_eq!(a.shared_with(&image), chunks - 1);
        a.forget_oldest();
        // Forgetting changes no chunk.
        assert_eq!(a.shared_with(&image), chunks - 1);
        *a.get_mut(&10).unwrap() = 5;
        assert_eq!(a.shared_with(&image), chunks - 2);
        assert_eq!(keys(&image), (0..1000).collect::<Vec<_>>());
        assert!(image
            .iter()
            .all(|(at, k, v)| *at == k + 100 && *v == k * 10));
        assert_eq!(
            keys(&a.entries()),
            (1..1000).chain([9000]).collect::<Vec<_>>()
        );
        assert_eq!((a.get(&10), a.get(&0)), (Some(&5), None));
        // A copy of the whole table (the index too) sees none of the other's changes.
        let mut b = a.clone();
        *b.get_mut(&10).unwrap() = 6;
        b.forget_oldest();
        assert_eq!(
            (a.get(&10), a.get(&1), a.len()),
            (Some(&5), Some(&10), 1000)
        );
        assert_eq!((b.get(&10), b.get(&1), b.len()), (Some(&6), None, 999));
    }
}
