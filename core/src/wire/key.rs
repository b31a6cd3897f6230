//! Validated keys ([`Key`]) and key groups ([`KeyGroup`]).

use super::{ErrorCode, MAX_KEY_LEN, MAX_SET_KEYS};

/// One validated key: 1..=128 bytes of UTF-8 with no space, CR or LF.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<[u8]>);

impl Key {
    /// Validates `bytes` as a key.
    pub fn new(bytes: &[u8]) -> Result<Key, ErrorCode> {
        if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
            return Err(ErrorCode::BadKey);
        }
        // Space, CR and LF would break the line-based tools and logs that
        // print keys; they are ASCII, so a byte scan is exact even in UTF-8.
        if bytes.iter().any(|&b| matches!(b, b' ' | b'\r' | b'\n')) {
            return Err(ErrorCode::BadKey);
        }
        if core::str::from_utf8(bytes).is_err() {
            return Err(ErrorCode::BadKey);
        }
        Ok(Key(bytes.into()))
    }
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// The key as text (always valid UTF-8).
    pub fn as_str(&self) -> &str {
        // Validated in `Key::new`, the only constructor.
        core::str::from_utf8(&self.0).unwrap_or_default()
    }
    /// The key's owned bytes (for a table that stores them without copying).
    pub fn into_boxed_bytes(self) -> Box<[u8]> {
        self.0
    }
}

/// A validated key group: 1..=16 keys, strictly ascending by raw bytes.
/// A single-key request (`A`/`R`) is a group of one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyGroup(Vec<Key>);

impl KeyGroup {
    /// A group of one key.
    pub fn single(key: Key) -> KeyGroup {
        KeyGroup(vec![key])
    }
    /// Validates count (1..=16) and strict ascending order.
    pub fn new(keys: Vec<Key>) -> Result<KeyGroup, ErrorCode> {
        if keys.is_empty() || keys.len() > MAX_SET_KEYS {
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
        Ok(KeyGroup(keys))
    }
    /// The keys, ascending.
    pub fn keys(&self) -> &[Key] {
        &self.0
    }
    /// Number of keys (1..=16).
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Always false: a group has at least one key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The keys, owned.
    pub fn into_keys(self) -> Vec<Key> {
        self.0
    }
}
