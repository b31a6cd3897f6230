//! Validated keys ([`Key`]) and key groups ([`KeyGroup`]).
//!
//! Both keep the common case off the heap: a key of up to
//! [`INLINE_KEY_LEN`] bytes is stored inline, and a group of one key holds
//! it without a `Vec`. A single-key request is then decoded, encoded and
//! cloned without allocating, on the server and in the client alike. Every
//! comparison, hash and `Debug` goes through the bytes, so the inline form
//! cannot be told from the boxed one.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use super::{ErrorCode, KEY_LEN_MAX, SET_KEYS_MAX};

/// Keys up to this many bytes are stored inline in the [`Key`]; longer ones
/// are boxed. 22 fills the 24 bytes of the boxed form (a tag byte and a
/// length byte beside the bytes), as the lock table's stored keys do.
const INLINE_KEY_LEN: usize = 22;

/// One validated key: 1..=128 bytes of UTF-8 with no space, CR or LF.
#[derive(Clone)]
pub struct Key(KeyBytes);

#[derive(Clone)]
enum KeyBytes {
    /// `bytes[..len]`.
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_LEN],
    },
    /// A key longer than [`INLINE_KEY_LEN`].
    Boxed(Box<[u8]>),
}

impl Key {
    /// Validates `bytes` as a key.
    pub fn new(bytes: &[u8]) -> Result<Key, ErrorCode> {
        if core::str::from_utf8(bytes).is_err() {
            return Err(ErrorCode::BadKey);
        }
        Key::from_utf8_bytes(bytes)
    }
    /// Validates `text` as a key: [`Key::new`] without the UTF-8 check a
    /// `str` has already passed.
    pub fn from_text(text: &str) -> Result<Key, ErrorCode> {
        Key::from_utf8_bytes(text.as_bytes())
    }
    /// The length and character rules, on bytes known to be UTF-8.
    fn from_utf8_bytes(bytes: &[u8]) -> Result<Key, ErrorCode> {
        if bytes.is_empty() || bytes.len() > KEY_LEN_MAX {
            return Err(ErrorCode::BadKey);
        }
        // Space, CR and LF would break the line-based tools and logs that
        // print keys; they are ASCII, so a byte scan is exact even in UTF-8.
        if bytes.iter().any(|&b| matches!(b, b' ' | b'\r' | b'\n')) {
            return Err(ErrorCode::BadKey);
        }
        Ok(Key(match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= INLINE_KEY_LEN => {
                let mut inline = [0; INLINE_KEY_LEN];
                inline[..bytes.len()].copy_from_slice(bytes);
                KeyBytes::Inline { len, bytes: inline }
            }
            _ => KeyBytes::Boxed(bytes.into()),
        }))
    }
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            KeyBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBytes::Boxed(bytes) => bytes,
        }
    }
    /// The key as text (always valid UTF-8).
    pub fn as_str(&self) -> &str {
        // Validated as UTF-8 by every constructor.
        core::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
    /// The key's bytes, owned (a copy for an inline key).
    pub fn into_boxed_bytes(self) -> Box<[u8]> {
        match self.0 {
            KeyBytes::Inline { .. } => self.as_bytes().into(),
            KeyBytes::Boxed(bytes) => bytes,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Exactly as `[u8]` (and the boxed bytes this used to be) hash.
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The shape a `Key(Box<[u8]>)` prints: traces and logs stay alike.
        f.debug_tuple("Key").field(&self.as_bytes()).finish()
    }
}

/// A validated key group: 1..=16 keys, strictly ascending by raw bytes.
/// A single-key request (`A`/`R`) is a group of one.
#[derive(Clone)]
pub struct KeyGroup(Keys);

#[derive(Clone)]
enum Keys {
    /// A group of one key (also what [`KeyGroup::new`] makes of one).
    One(Key),
    /// 2..=16 keys.
    Many(Vec<Key>),
}

impl KeyGroup {
    /// A group of one key.
    pub fn single(key: Key) -> KeyGroup {
        KeyGroup(Keys::One(key))
    }
    /// Validates count (1..=16) and strict ascending order.
    pub fn new(mut keys: Vec<Key>) -> Result<KeyGroup, ErrorCode> {
        if keys.is_empty() || keys.len() > SET_KEYS_MAX {
            return Err(ErrorCode::BadKeySet);
        }
        // Strictly ascending also rules out duplicates, and gives every set
        // one canonical order (the order the lock table takes keys in).
        if !keys
            .windows(2)
            .all(|pair| pair[0].as_bytes() < pair[1].as_bytes())
        {
            return Err(ErrorCode::BadKeySet);
        }
        if keys.len() == 1
            && let Some(key) = keys.pop()
        {
            return Ok(KeyGroup::single(key));
        }
        Ok(KeyGroup(Keys::Many(keys)))
    }
    /// The keys, ascending.
    pub fn keys(&self) -> &[Key] {
        match &self.0 {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many(keys) => keys,
        }
    }
    /// Number of keys (1..=16).
    pub fn len(&self) -> usize {
        self.keys().len()
    }
    /// Always false: a group has at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys().is_empty()
    }
    /// The keys, owned.
    pub fn into_keys(self) -> Vec<Key> {
        match self.0 {
            Keys::One(key) => vec![key],
            Keys::Many(keys) => keys,
        }
    }
}

impl PartialEq for KeyGroup {
    fn eq(&self, other: &Self) -> bool {
        self.keys() == other.keys()
    }
}

impl Eq for KeyGroup {}

impl Hash for KeyGroup {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the `Vec<Key>` this used to be hashes.
        self.keys().hash(state);
    }
}

impl fmt::Debug for KeyGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The shape a `KeyGroup(Vec<Key>)` prints.
        f.debug_tuple("KeyGroup").field(&self.keys()).finish()
    }
}

// What the inline forms cost in size: a key is 24 bytes (16 as a bare box),
// a group 32 (24 as a bare `Vec`).
const _: () = {
    assert!(size_of::<Key>() == 24);
    assert!(size_of::<KeyGroup>() == 32);
};

/// The key that stands for slot `slot` of the semaphore `name`:
/// `name[0003]`. A permit grant is a grant of its slots' keys under one
/// token, so it is released (`G`), renewed (`W`), inspected and
/// force-released as any key set is. Four digits keep the keys of one
/// semaphore in slot order when sorted by bytes. `None` when `name` is
/// longer than [`super::SEMAPHORE_NAME_LEN_MAX`] or `slot` has more than
/// four digits.
pub fn slot_key(name: &Key, slot: u16) -> Option<Key> {
    if name.as_bytes().len() > super::SEMAPHORE_NAME_LEN_MAX || slot > 9999 {
        return None;
    }
    let mut bytes = Vec::with_capacity(name.as_bytes().len() + super::SLOT_SUFFIX_LEN);
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(format!("[{slot:04}]").as_bytes());
    Key::new(&bytes).ok()
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    #[test]
    fn slot_keys_sort_in_slot_order_and_fit_the_key_limit() {
        let name = Key::new(b"jobs").unwrap();
        let keys: Vec<Key> = [0, 2, 10, 999, 1023]
            .iter()
            .map(|&slot| slot_key(&name, slot).unwrap())
            .collect();
        assert_eq!(keys[0].as_bytes(), b"jobs[0000]");
        assert_eq!(keys[2].as_bytes(), b"jobs[0010]");
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
        let longest = Key::new(&[b'n'; crate::wire::SEMAPHORE_NAME_LEN_MAX]).unwrap();
        assert_eq!(
            slot_key(&longest, 7).unwrap().as_bytes().len(),
            crate::wire::KEY_LEN_MAX
        );
        let too_long = Key::new(&[b'n'; crate::wire::SEMAPHORE_NAME_LEN_MAX + 1]).unwrap();
        assert_eq!(slot_key(&too_long, 7), None);
        assert_eq!(slot_key(&name, 10_000), None);
    }
}
