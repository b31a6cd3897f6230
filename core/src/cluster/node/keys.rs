//! The leader's per-key table ([`LeaderKeys`]): for every key it knows
//! something about beyond the applied state, the waiters queued on it,
//! whether a Grant in flight reserves it and whether its holder's Release
//! is in flight. One map, so a key is hashed and found once where three
//! tables (queues, reserved, releasing) each hashed it; the map is the
//! lock table's ([`Keyed`]), so the hash stays std's keyed SipHash (key
//! bytes come from clients). Nothing iterates
//! it in an order that matters (the listing sorts what it takes).

use std::collections::VecDeque;

use crate::keyed::Keyed;
use crate::wire::Key;

/// What the leader knows of one key beyond the applied state. A key
/// with no waiter that is neither reserved nor releasing has no entry.
#[derive(Debug, Default)]
pub(super) struct KeyQueue {
    /// Its waiters (sequence numbers), FIFO.
    pub(super) waiters: VecDeque<u64>,
    /// A Grant proposal not yet applied takes it.
    pub(super) reserved: bool,
    /// Its holder's Release is proposed and not yet applied. The queue
    /// head's Grant may be proposed at once: it follows the Release in the
    /// log, so one commit carries the whole hand-over. Only held keys get
    /// it, so it is bounded by the held keys.
    pub(super) releasing: bool,
    /// Shared Grant proposals not yet applied that take it (several may be
    /// in flight at once; `reserved` is for an exclusive one). Bounded by
    /// the proposals in flight.
    pub(super) shared_reserved: u32,
}

impl KeyQueue {
    fn is_idle(&self) -> bool {
        self.waiters.is_empty() && !self.is_reserved() && !self.releasing
    }

    /// Whether a Grant in flight takes it, in either mode.
    pub(super) fn is_reserved(&self) -> bool {
        self.reserved || self.shared_reserved > 0
    }

    /// A Grant taking it in this mode is proposed.
    pub(super) fn reserve(&mut self, shared: bool) {
        if shared {
            self.shared_reserved += 1;
        } else {
            self.reserved = true;
        }
    }

    /// A Grant taking it in this mode applied (or was dropped).
    pub(super) fn unreserve(&mut self, shared: bool) {
        if shared {
            self.shared_reserved = self.shared_reserved.saturating_sub(1);
        } else {
            self.reserved = false;
        }
    }

    /// The first waiter.
    pub(super) fn head(&self) -> Option<u64> {
        self.waiters.front().copied()
    }
}

/// The leader's keys (see the module docs).
#[derive(Debug, Default)]
pub(super) struct LeaderKeys {
    map: Keyed<Key, KeyQueue>,
}

impl LeaderKeys {
    /// What is known of `key`, if anything.
    pub(super) fn get(&self, key: &Key) -> Option<&KeyQueue> {
        self.map.get(key.as_bytes())
    }

    /// Runs `change` on `key`'s entry (made if absent), which goes again
    /// if `change` left it idle.
    pub(super) fn update<R>(&mut self, key: &Key, change: impl FnOnce(&mut KeyQueue) -> R) -> R {
        let hash = self.map.hash(key.as_bytes());
        let queue =
            self.map
                .get_or_insert_with(hash, key.as_bytes(), |_| key.clone(), KeyQueue::default);
        let result = change(queue);
        if queue.is_idle() {
            self.map.remove(hash, key.as_bytes());
        }
        result
    }

    /// Runs `change` on `key`'s entry if it has one, which goes if
    /// `change` left it idle.
    pub(super) fn update_existing<R>(
        &mut self,
        key: &Key,
        change: impl FnOnce(&mut KeyQueue) -> R,
    ) -> Option<R> {
        let hash = self.map.hash(key.as_bytes());
        let queue = self.map.find_mut(hash, key.as_bytes())?;
        let result = change(queue);
        if queue.is_idle() {
            self.map.remove(hash, key.as_bytes());
        }
        Some(result)
    }

    /// The map itself, for an operator's paged scan.
    pub(super) fn map(&self) -> &Keyed<Key, KeyQueue> {
        &self.map
    }

    /// Forgets every waiter (shutdown), keeping what Grants and Releases
    /// in flight reserve.
    pub(super) fn clear_waiters(&mut self) {
        self.map.retain(|_, queue| {
            queue.waiters.clear();
            !queue.is_idle()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::LeaderKeys;
    use crate::wire::Key;

    fn key(name: &str) -> Key {
        Key::new(name.as_bytes()).unwrap()
    }

    #[test]
    fn an_entry_lives_while_it_has_a_waiter_a_reservation_or_a_release() {
        let mut keys = LeaderKeys::default();
        keys.update(&key("a"), |q| q.waiters.push_back(1));
        keys.update(&key("a"), |q| q.reserved = true);
        keys.update(&key("b"), |q| q.releasing = true);
        assert_eq!(keys.get(&key("a")).and_then(|q| q.head()), Some(1));
        keys.update_existing(&key("a"), |q| q.waiters.pop_front());
        assert!(
            keys.get(&key("a")).is_some_and(|q| q.reserved),
            "still reserved"
        );
        keys.update_existing(&key("a"), |q| q.reserved = false);
        assert!(keys.get(&key("a")).is_none(), "idle: gone");
        assert!(keys.update_existing(&key("a"), |_| ()).is_none());
        // Nothing to change leaves no entry behind.
        keys.update(&key("c"), |_| ());
        assert!(keys.get(&key("c")).is_none());
        keys.update(&key("b"), |q| q.waiters.push_back(2));
        keys.clear_waiters();
        assert!(
            keys.get(&key("b"))
                .is_some_and(|q| q.waiters.is_empty() && q.releasing)
        );
        keys.update_existing(&key("b"), |q| q.releasing = false);
        assert_eq!(keys.map().len(), 0);
    }
}
