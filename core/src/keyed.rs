//! The maps keyed by key bytes, hashed once per request: a key's hash is
//! computed when a request arrives ([`Keyed::hash`]) and carried with the
//! key (in waiters and lease-deadline entries too), so every look-up,
//! insert and removal of that key afterwards only probes and compares.
//! Key bytes come from clients, so the hash stays std's keyed SipHash
//! (one [`RandomState`] shared by the table's maps, so one hash serves
//! them all); see [`crate::hash`] for which maps may hash more cheaply.

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

/// A key's hash under its table's [`RandomState`]. Only meaningful with
/// the maps of the table that computed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct KeyHash(u64);

/// What a map's key is, as bytes (the map compares keys by these).
pub(crate) trait KeyBytes {
    fn key_bytes(&self) -> &[u8];
}

impl KeyBytes for Box<[u8]> {
    fn key_bytes(&self) -> &[u8] {
        self
    }
}

/// A hash map from key bytes to `V`, looked up by a [`KeyHash`] computed
/// once. Same layout as a `HashMap<K, V>`: one `(K, V)` per bucket. The
/// lock table's maps and the cluster's per-key tables all use it.
#[derive(Clone, Debug)]
pub(crate) struct Keyed<K, V> {
    hasher: RandomState,
    table: HashTable<(K, V)>,
}

impl KeyBytes for crate::wire::Key {
    fn key_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl<K: KeyBytes, V> Default for Keyed<K, V> {
    /// An empty map with a hasher of its own.
    fn default() -> Self {
        Keyed::new(RandomState::new())
    }
}

impl<K: KeyBytes, V> Keyed<K, V> {
    /// An empty map hashing with `hasher` (give every map that shares
    /// hashes the same one).
    pub(crate) fn new(hasher: RandomState) -> Self {
        Keyed {
            hasher,
            table: HashTable::new(),
        }
    }

    /// `key`'s hash, for the calls below.
    pub(crate) fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash(self.hasher.hash_one(key))
    }

    /// The value of `key` (hashes it: for the paths that do not carry a
    /// hash).
    pub(crate) fn get(&self, key: &[u8]) -> Option<&V> {
        self.find(self.hash(key), key)
    }

    /// The value of `key`, whose hash is `hash`.
    pub(crate) fn find(&self, hash: KeyHash, key: &[u8]) -> Option<&V> {
        self.table
            .find(hash.0, |(k, _)| k.key_bytes() == key)
            .map(|(_, value)| value)
    }

    /// The value of `key`, whose hash is `hash`, mutably.
    pub(crate) fn find_mut(&mut self, hash: KeyHash, key: &[u8]) -> Option<&mut V> {
        self.table
            .find_mut(hash.0, |(k, _)| k.key_bytes() == key)
            .map(|(_, value)| value)
    }

    /// Removes `key` (hash `hash`) and returns its value.
    pub(crate) fn remove(&mut self, hash: KeyHash, key: &[u8]) -> Option<V> {
        self.table
            .find_entry(hash.0, |(k, _)| k.key_bytes() == key)
            .ok()
            .map(|entry| entry.remove().0.1)
    }

    /// Removes `key` (hash `hash`) if `remove` says so of its value, in
    /// one probe; whether it was removed.
    pub(crate) fn remove_if(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        remove: impl FnOnce(&V) -> bool,
    ) -> bool {
        match self.table.find_entry(hash.0, |(k, _)| k.key_bytes() == key) {
            Ok(entry) if remove(&entry.get().1) => {
                entry.remove();
                true
            }
            _ => false,
        }
    }

    /// The value of `key` (hash `hash`), inserting `make_key(key)` with
    /// `make_value()` first if absent.
    pub(crate) fn get_or_insert_with(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        make_key: impl FnOnce(&[u8]) -> K,
        make_value: impl FnOnce() -> V,
    ) -> &mut V {
        let hasher = &self.hasher;
        let entry = self
            .table
            .entry(
                hash.0,
                |(k, _)| k.key_bytes() == key,
                |(k, _)| hasher.hash_one(k.key_bytes()),
            )
            .or_insert_with(|| (make_key(key), make_value()));
        &mut entry.into_mut().1
    }

    /// Inserts `key` (hash `hash`), known to be absent.
    pub(crate) fn insert_absent(&mut self, hash: KeyHash, key: K, value: V) {
        debug_assert!(self.find(hash, key.key_bytes()).is_none());
        let hasher = &self.hasher;
        self.table.insert_unique(hash.0, (key, value), |(k, _)| {
            hasher.hash_one(k.key_bytes())
        });
    }

    /// Entries in the map.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Slots of the underlying table: the range a [`Keyed::scan`] cursor
    /// moves over. It changes only when the table grows or shrinks.
    pub(crate) fn slots(&self) -> usize {
        self.table.num_buckets()
    }

    /// The entries for which `keep` holds, in slot order from slot `from`,
    /// examining at most `slots_max` slots and stopping after `found_max`
    /// entries kept; with the slot to go on from, `None` once the end of
    /// the table was reached. Bounded work whatever the map's size: what
    /// an operator's paged listing needs so that no call can stall the
    /// state machine.
    pub(crate) fn scan(
        &self,
        from: usize,
        slots_max: usize,
        found_max: usize,
        mut keep: impl FnMut(&K, &V) -> bool,
    ) -> (Vec<&K>, Option<usize>) {
        let slots = self.table.num_buckets();
        let end = from.saturating_add(slots_max).min(slots);
        let mut found = Vec::new();
        let mut slot = from;
        while slot < end && found.len() < found_max {
            if let Some((key, value)) = self.table.get_bucket(slot)
                && keep(key, value)
            {
                found.push(key);
            }
            slot += 1;
        }
        (found, (slot < slots).then_some(slot))
    }

    /// Every value, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|(_, value)| value)
    }

    /// Keeps the entries for which `keep` holds.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.table.retain(|(key, value)| keep(key, value));
    }

    /// Removes every entry.
    pub(crate) fn clear(&mut self) {
        self.table.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hash_serves_every_map_of_a_hasher() {
        let hasher = RandomState::new();
        let mut a: Keyed<Box<[u8]>, u32> = Keyed::new(hasher.clone());
        let mut b: Keyed<Box<[u8]>, u32> = Keyed::new(hasher);
        let hash = a.hash(b"key");
        assert_eq!(hash, b.hash(b"key"));
        *a.get_or_insert_with(hash, b"key", |key| key.into(), || 1) += 1;
        b.insert_absent(hash, b"key".as_slice().into(), 7);
        // Enough keys to resize both tables (rehashed by the same hasher).
        for n in 0u32..1_000 {
            let key = n.to_be_bytes();
            a.insert_absent(a.hash(&key), key.as_slice().into(), n);
        }
        assert_eq!(a.find(hash, b"key"), Some(&2));
        assert_eq!(a.get(&999u32.to_be_bytes()), Some(&999));
        assert_eq!(b.find(hash, b"key"), Some(&7));
        assert_eq!(a.remove(hash, b"key"), Some(2));
        assert_eq!(a.get(b"key"), None);
        assert_eq!(a.len(), 1_000);
        a.retain(|_, value| *value < 10);
        assert_eq!(a.len(), 10);
        assert_eq!(a.values().sum::<u32>(), 45);
        b.clear();
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn a_scan_examines_at_most_its_slots_and_visits_every_entry_once_across_calls() {
        let mut map: Keyed<Box<[u8]>, u32> = Keyed::default();
        for n in 0u32..5_000 {
            let key = n.to_be_bytes();
            map.insert_absent(map.hash(&key), key.as_slice().into(), n);
        }
        let slots = map.slots();
        let mut seen = std::collections::BTreeSet::new();
        let mut from = Some(0);
        let mut calls = 0;
        while let Some(start) = from {
            let (found, next) = map.scan(start, 100, usize::MAX, |_, v| v % 2 == 0);
            if let Some(next) = next {
                assert_eq!(next, start + 100, "a full budget moves exactly 100 slots");
            }
            for key in found {
                assert!(seen.insert(key.clone()), "each entry once");
            }
            from = next;
            calls += 1;
        }
        assert_eq!(calls, slots.div_ceil(100));
        assert_eq!(seen.len(), 2_500, "every kept entry, and only those");
        // Stopping at `found_max` resumes right after the last one found.
        let (first, next) = map.scan(0, slots, 1, |_, _| true);
        assert_eq!(first.len(), 1);
        let (rest, _) = map.scan(next.unwrap(), slots, usize::MAX, |_, _| true);
        assert_eq!(rest.len(), 4_999);
        assert!(!rest.contains(&first[0]));
    }
}
