//! A bounds-checked big-endian reader shared by the replicated-command,
//! snapshot and peer codecs. Every read either succeeds or returns `None`;
//! nothing here can panic on hostile input.

use crate::wire::{Key, KeyGroup, SET_KEYS_MAX};

/// Reads big-endian fields from a byte slice, front to back.
#[derive(Clone, Debug)]
pub(crate) struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.data.len() {
            return None;
        }
        let (taken, rest) = self.data.split_at(len);
        self.data = rest;
        Some(taken)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn bool(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    /// A key group as `count u8 · count × (len u8 · key)`, validated exactly
    /// like one from a client (1..=16 keys, strictly ascending, each key
    /// valid).
    pub(crate) fn key_group(&mut self) -> Option<KeyGroup> {
        let count = usize::from(self.u8()?);
        if count == 0 || count > SET_KEYS_MAX {
            return None;
        }
        if count == 1 {
            // The common case, without the `Vec` a group of one never keeps.
            let len = usize::from(self.u8()?);
            return Some(KeyGroup::single(Key::new(self.bytes(len)?).ok()?));
        }
        let mut keys = Vec::with_capacity(count);
        for _ in 0..count {
            let len = usize::from(self.u8()?);
            keys.push(Key::new(self.bytes(len)?).ok()?);
        }
        KeyGroup::new(keys).ok()
    }
}

/// Appends a key group as `count u8 · count × (len u8 · key)`. A valid
/// group has at most 16 keys of at most 128 bytes, so both counts fit a byte.
pub(crate) fn put_key_group(out: &mut Vec<u8>, keys: &KeyGroup) {
    out.push(u8::try_from(keys.len()).unwrap_or(u8::MAX));
    for key in keys.keys() {
        let bytes = key.as_bytes();
        out.push(u8::try_from(bytes.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(bytes);
    }
}
