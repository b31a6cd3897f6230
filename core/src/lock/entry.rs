//! What the lock table stores per key, packed: a busy server holds a
//! million of these, and a hash table just past a doubling has about two
//! buckets per key, so every byte of a bucket counts twice.
//!
//! A bucket is a [`StoredKey`] (24 bytes: short keys inline, no allocation)
//! and a [`KeyEntry`] (24 bytes: token, lease deadline, one packed word).
//! Waiter queues live in a separate map, only for keys that have waiters.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use crate::time::Instant;

/// Keys up to this many bytes are stored inline in the bucket; longer ones
/// are boxed. 22 fills the enum's 24 bytes (a tag byte and a length byte).
pub(super) const INLINE_KEY_LEN: usize = 22;

/// A key's bytes as the table stores them. Hashes and compares exactly as
/// its bytes (`[u8]`), so the table is looked up by `&[u8]`.
#[derive(Clone)]
pub(super) enum StoredKey {
    /// `bytes[..len]`.
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_LEN],
    },
    /// A key longer than [`INLINE_KEY_LEN`].
    Boxed(Box<[u8]>),
}

impl StoredKey {
    /// Stores a copy of `key`.
    pub(super) fn from_bytes(key: &[u8]) -> Self {
        if key.len() <= INLINE_KEY_LEN {
            StoredKey::inline(key)
        } else {
            StoredKey::Boxed(key.into())
        }
    }

    /// `key` inline; at most [`INLINE_KEY_LEN`] bytes (the callers check).
    fn inline(key: &[u8]) -> Self {
        let mut bytes = [0; INLINE_KEY_LEN];
        bytes[..key.len()].copy_from_slice(key);
        StoredKey::Inline {
            len: u8::try_from(key.len()).expect("an inline key is at most 22 bytes"),
            bytes,
        }
    }

    /// The key's bytes.
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            StoredKey::Boxed(bytes) => bytes,
        }
    }
}

impl std::ops::Deref for StoredKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialOrd for StoredKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StoredKey {
    /// As its bytes order (as the `Box<[u8]>` keys it replaced).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl crate::keyed::KeyBytes for StoredKey {
    fn key_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Borrow<[u8]> for StoredKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Hash for StoredKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Exactly as `[u8]` hashes, as `Borrow<[u8]>` requires.
        self.as_bytes().hash(state);
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for StoredKey {}

impl std::fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StoredKey")
            .field(&String::from_utf8_lossy(self.as_bytes()))
            .finish()
    }
}

/// The largest holder tag a key entry stores (48 bits; see
/// [`super::LockTable::acquire_as`]).
pub const HOLDER_MAX: u64 = (1 << 48) - 1;

const HOLDER_BITS: u32 = 48;
const LEASE_SHIFT: u32 = HOLDER_BITS;
const GROUP_SHIFT: u32 = LEASE_SHIFT + 8;
/// Five bits: a group has 1..=16 keys (0 while nobody holds the key).
const GROUP_MASK: u64 = 0x1f;
const QUEUED_BIT: u64 = 1 << 63;
/// The grant has a cap or was extended: its record is in the table's
/// extension map (so no other grant pays a look-up there).
const EXTENSION_BIT: u64 = 1 << 62;
/// The key is held in shared mode: its holders are in the table's sharer
/// map, and the entry's token and deadline are those of the sharer whose
/// lease ends last (see `shared.rs`).
const SHARED_BIT: u64 = 1 << 61;

/// One key in the table. 24 bytes; the key bytes live in the map's key.
///
/// A key exists while it has a holder (`token != 0`, possibly with an expired
/// lease that nobody has looked at yet) or waiters; a key with neither is
/// deleted at once.
#[derive(Debug)]
pub(super) struct KeyEntry {
    /// The holder's fencing token; 0 = no holder.
    pub(super) token: u64,
    /// When the holder's lease ends. Meaningless if `token == 0`.
    pub(super) lease_deadline: Instant,
    /// Bits 0..48: the holder's tag (the caller's name for whoever was
    /// granted the key); 48..56: the grant's lease in seconds (so the grant
    /// time is known for the hold-time histogram); 56..61: the number of
    /// keys in the grant (so a release can tell whether it names exactly
    /// the granted group without a per-grant index); 61: whether the key
    /// is held in shared mode; 62: whether the grant
    /// has an extension record (a cap, or an extension: see
    /// `extend.rs`); 63: whether the key has a waiter queue (in [`super::LockTable`]'s queue map). One word
    /// instead of fields, so the entry has no padding.
    packed: u64,
}

impl KeyEntry {
    /// A key that only has waiters so far.
    pub(super) fn unheld() -> Self {
        KeyEntry {
            token: 0,
            lease_deadline: Instant::ZERO,
            packed: 0,
        }
    }

    /// Records a new grant's holder tag, size and lease (the token and
    /// deadline are set by the caller), without an extension record.
    pub(super) fn set_grant(&mut self, holder: u64, group_len: u8, lease_s: u8) {
        debug_assert!(holder <= HOLDER_MAX && u64::from(group_len) <= GROUP_MASK);
        self.packed = (self.packed & QUEUED_BIT)
            | (holder & HOLDER_MAX)
            | (u64::from(lease_s) << LEASE_SHIFT)
            | ((u64::from(group_len) & GROUP_MASK) << GROUP_SHIFT);
    }

    /// The holder's tag (0 when the caller gave none).
    pub(super) fn holder(&self) -> u64 {
        self.packed & HOLDER_MAX
    }

    /// Keys in the holder's grant.
    pub(super) fn group_len(&self) -> u8 {
        // Five bits.
        ((self.packed >> GROUP_SHIFT) & GROUP_MASK) as u8
    }

    /// The holder's lease in seconds.
    pub(super) fn lease_s(&self) -> u8 {
        // Eight bits.
        ((self.packed >> LEASE_SHIFT) & 0xff) as u8
    }

    /// Whether somebody waits on the key (its queue is in the queue map).
    pub(super) fn is_queued(&self) -> bool {
        self.packed & QUEUED_BIT != 0
    }

    /// Whether the key is held in shared mode (its holders are in the
    /// table's sharer map).
    pub(super) fn is_shared(&self) -> bool {
        self.packed & SHARED_BIT != 0
    }

    pub(super) fn set_shared(&mut self, shared: bool) {
        if shared {
            self.packed |= SHARED_BIT;
        } else {
            self.packed &= !SHARED_BIT;
        }
    }

    /// Whether the grant has a record in the table's extension map.
    pub(super) fn has_extension(&self) -> bool {
        self.packed & EXTENSION_BIT != 0
    }

    pub(super) fn set_extension(&mut self, extension: bool) {
        if extension {
            self.packed |= EXTENSION_BIT;
        } else {
            self.packed &= !EXTENSION_BIT;
        }
    }

    pub(super) fn set_queued(&mut self, queued: bool) {
        if queued {
            self.packed |= QUEUED_BIT;
        } else {
            self.packed &= !QUEUED_BIT;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_key_structs_stay_within_their_sizes() {
        // A bucket of the key map is both of these; the memory goal
        // (<= 120 bytes per held key beyond the key bytes, with the table
        // just past a doubling: about 2.1 buckets per key) depends on it.
        assert!(core::mem::size_of::<StoredKey>() <= 24);
        assert!(core::mem::size_of::<KeyEntry>() <= 24);
        assert!(core::mem::size_of::<(StoredKey, KeyEntry)>() <= 48);
    }

    #[test]
    fn stored_keys_look_up_as_their_bytes() {
        use std::collections::HashMap;
        let short = b"sixteen-byte-key".as_slice();
        let long = [b'k'; 128];
        let mut map = HashMap::new();
        map.insert(StoredKey::from_bytes(short), 1);
        map.insert(StoredKey::from_bytes(&long), 2);
        map.insert(StoredKey::from_bytes(&[b'x'; INLINE_KEY_LEN]), 3);
        assert!(matches!(
            StoredKey::from_bytes(short),
            StoredKey::Inline { .. }
        ));
        assert!(matches!(
            StoredKey::from_bytes(&[b'x'; INLINE_KEY_LEN + 1]),
            StoredKey::Boxed(_)
        ));
        assert_eq!(map.get(short), Some(&1));
        assert_eq!(map.get(long.as_slice()), Some(&2));
        assert_eq!(map.get([b'x'; INLINE_KEY_LEN].as_slice()), Some(&3));
        assert_eq!(map.get(b"sixteen-byte-ke".as_slice()), None);
        assert_eq!(map.get([b'x'; INLINE_KEY_LEN + 1].as_slice()), None);
    }

    #[test]
    fn packed_grant_fields_read_back_and_keep_the_queue_bit() {
        let mut entry = KeyEntry::unheld();
        assert!(!entry.is_queued());
        entry.set_queued(true);
        entry.set_grant(HOLDER_MAX, 16, 250);
        assert_eq!(
            (entry.holder(), entry.group_len(), entry.lease_s()),
            (HOLDER_MAX, 16, 250)
        );
        assert!(entry.is_queued());
        entry.set_grant(7, 1, 1);
        assert_eq!(
            (entry.holder(), entry.group_len(), entry.lease_s()),
            (7, 1, 1)
        );
        entry.set_queued(false);
        assert!(!entry.is_queued());
        assert_eq!(
            (entry.holder(), entry.group_len(), entry.lease_s()),
            (7, 1, 1)
        );
    }

    #[test]
    fn the_extension_bit_is_its_own_and_a_new_grant_clears_it() {
        let mut entry = KeyEntry::unheld();
        entry.set_queued(true);
        entry.set_grant(HOLDER_MAX, 16, 250);
        entry.set_extension(true);
        assert!(entry.has_extension() && entry.is_queued());
        assert_eq!(
            (entry.holder(), entry.group_len(), entry.lease_s()),
            (HOLDER_MAX, 16, 250)
        );
        entry.set_grant(7, 1, 1);
        assert!(!entry.has_extension() && entry.is_queued());
    }
}
