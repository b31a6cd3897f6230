//! Replicated commands: what a leader proposes, what every node applies.
//!
//! A command travels in a Raft entry as opaque bytes. The encoding is
//! compact, deterministic (one command has exactly one encoding) and
//! validated on decode exactly like client input, so a corrupted or hostile
//! entry can only ever decode to `None`, which every node applies as a
//! no-op in the same way.
//!
//! Layout (big-endian; key groups are `count u8 · count × (len u8 · key)`):
//!
//! | tag | command | fields after the tag |
//! |---|---|---|
//! | `0x01` | [`Command::Init`] | first_token u64 |
//! | `0x02` | [`Command::Grant`] | lease_ms u32 · keys |
//! | `0x03` | [`Command::Release`] | token u64 · keys |
//! | `0x04` | [`Command::Expire`] | token u64 · keys |
//! | `0x05` | [`Command::ForceRelease`] | has_token u8 (0/1) · token u64 (0 unless has_token) · len u8 · key |
//! | `0x06` | [`Command::Grant`] with a cap | lease_ms u32 · max_hold_ms u32 · keys |
//! | `0x07` | [`Command::Extend`] | token u64 · lease_ms u32 |
//! | `0x08` | [`Command::Grant`] with [`GrantOptions`] | lease_ms u32 · has_cap u8 (0/1) · max_hold_ms u32 (0 unless has_cap) · options · keys |
//! | `0x09` | [`Command::Downgrade`] | token u64 · keys |
//!
//! Options are `shared_modes u16 · capacity u16 (0: not a semaphore) ·
//! label_len u8 · label` (see [`GrantOptions`]); no bit of `shared_modes`
//! at or past the number of keys.
//!
//! A Grant without a cap keeps tag `0x02` and its bytes, so logs written
//! before caps existed decode as they did, and a node that predates caps
//! and extensions decodes every entry a leader writes until one is used.
//! Likewise a Grant with default options keeps tag `0x02` or `0x06`: only
//! a grant that uses modes, slots or a label is written under `0x08`.

use crate::cluster::bytes::{Reader, put_key_group};
use crate::lock::ExtendOutcome;
use crate::wire::{Key, KeyGroup, LABEL_LEN_MAX, LeaderLabel};

/// A [`Command::Init`] must start the token counter below this (2^62);
/// one starting higher does not decode. The first token is the bootstrap
/// wall clock in microseconds (about 2^51 today), so this refuses only
/// corruption, and leaves 3 · 2^62 grants of headroom below `u64::MAX`.
pub const FIRST_TOKEN_MAX: u64 = 1 << 62;

/// Largest encoded command: a Grant with every option of 16 keys of 128
/// bytes (lease, cap flag and cap, modes, capacity, the longest label).
pub const COMMAND_LEN_MAX: usize = 1 + 4 + 1 + 4 + 2 + 2 + 1 + LABEL_LEN_MAX + 1 + 16 * (1 + 128);

/// Tag of [`Command::Init`].
const TAG_INIT: u8 = 0x01;
/// Tag of [`Command::Grant`].
const TAG_GRANT: u8 = 0x02;
/// Tag of [`Command::Release`].
const TAG_RELEASE: u8 = 0x03;
/// Tag of [`Command::Expire`].
const TAG_EXPIRE: u8 = 0x04;
/// Tag of [`Command::ForceRelease`].
const TAG_FORCE_RELEASE: u8 = 0x05;
/// Tag of a [`Command::Grant`] with a cap on total hold.
const TAG_GRANT_CAPPED: u8 = 0x06;
/// Tag of [`Command::Extend`].
const TAG_EXTEND: u8 = 0x07;
/// Tag of [`Command::Downgrade`].
const TAG_DOWNGRADE: u8 = 0x09;
/// Tag of a [`Command::Grant`] with non-default [`GrantOptions`].
const TAG_GRANT_OPTIONS: u8 = 0x08;

/// What a grant is beyond its keys and lease: which keys it holds shared,
/// whether they are a semaphore's slots, and the label of the holder's
/// connection. Replicated with the grant, so a new leader knows them.
/// The default, a plain exclusive grant without a label, is encoded
/// exactly as grants were before options existed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GrantOptions {
    /// Bit `i` set: key `i` of the group (ascending) is held shared.
    pub shared_modes: u16,
    /// `Some(n)`: the keys are slot keys ([`crate::wire::slot_key`]) of one
    /// semaphore of capacity `n` (1 or more).
    pub capacity: Option<u16>,
    /// The label the holder's connection negotiated: who an election's
    /// leader is, for `O`.
    pub label: Option<LeaderLabel>,
}

impl GrantOptions {
    /// Whether these are the options of a plain grant.
    pub fn is_default(&self) -> bool {
        *self == GrantOptions::default()
    }

    /// Length of [`GrantOptions::encode`]'s output.
    pub(crate) fn encoded_len(&self) -> usize {
        2 + 2 + 1 + self.label.map_or(0, |label| label.as_str().len())
    }

    /// Appends `shared_modes u16 · capacity u16 · label_len u8 · label`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.shared_modes.to_be_bytes());
        out.extend_from_slice(&self.capacity.unwrap_or(0).to_be_bytes());
        let label = self.label.as_ref().map_or("", LeaderLabel::as_str);
        // A label is at most 64 bytes.
        out.push(u8::try_from(label.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(label.as_bytes());
    }

    /// Reads what [`GrantOptions::encode`] wrote; `None` for a label that
    /// an `X` could not carry (too long, not UTF-8, control characters)
    /// or an empty one (written as no label: one encoding per value).
    pub(crate) fn decode(r: &mut Reader<'_>) -> Option<GrantOptions> {
        let shared_modes = r.u16()?;
        let capacity = match r.u16()? {
            0 => None,
            n => Some(n),
        };
        let len = usize::from(r.u8()?);
        let label = match len {
            0 => None,
            _ => Some(LeaderLabel::new(std::str::from_utf8(r.bytes(len)?).ok()?)?),
        };
        Some(GrantOptions {
            shared_modes,
            capacity,
            label,
        })
    }

    /// Whether the modes name only keys a group of `keys` has.
    pub(crate) fn fits(&self, keys: &KeyGroup) -> bool {
        u32::from(self.shared_modes) >> keys.len() == 0
    }
}

/// A lock-state change, replicated through Raft (docs/cluster.md,
/// "Replicated commands").
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Starts the fencing domain's token counter. The first leader proposes
    /// it with the bootstrap wall-clock time in microseconds since the Unix
    /// epoch; only the first one applied counts (later ones — a new leader
    /// that had not yet applied the first — are no-ops), so every node
    /// starts the counter at the same value.
    Init {
        /// The first token the domain issues.
        first_token: u64,
    },
    /// Acquire a key group. The token is not in the command: every node
    /// allocates it from the replicated counter at apply, so all compute the
    /// same one.
    Grant {
        /// The keys (1..=16, ascending); one token covers them all.
        keys: KeyGroup,
        /// The lease, counted by each node on its own clock from when it
        /// applies the grant.
        lease_ms: u32,
        /// A cap on the grant's total hold, counted like the lease from
        /// each node's apply: no lease or extension runs past it (a longer
        /// first lease is clipped to it). `None`: no cap, encoded exactly
        /// as a Grant was before caps existed.
        max_hold_ms: Option<u32>,
        /// Modes, semaphore and label.
        options: GrantOptions,
    },
    /// Release the grant `token` holds on exactly `keys`.
    Release {
        /// The keys named by the client.
        keys: KeyGroup,
        /// The token named by the client.
        token: u64,
    },
    /// Leader-driven lease expiry: removes the grant only if `token` is
    /// still current, so a late or duplicated expiry never removes a newer
    /// grant (idempotent).
    Expire {
        /// The keys of the grant.
        keys: KeyGroup,
        /// The grant's token.
        token: u64,
    },
    /// An operator's force-release (`POST /v1/locks/{key}/release`):
    /// removes the whole grant holding `key`, exactly as its holder's
    /// release would, if `token` is `None` or is the token holding it.
    /// What it revokes is decided at apply from the replicated state, so
    /// every node revokes the same grant.
    ForceRelease {
        /// Any key of the grant.
        key: Key,
        /// Release only if this token still holds the key.
        token: Option<u64>,
    },
    /// Renews grant `token`'s lease to `lease_ms` after each node's apply,
    /// clipped to the grant's cap (see [`crate::lock::decide_extension`]).
    /// Whether the token is current is decided from the replicated state,
    /// the same on every node; where the lease now ends (and so whether
    /// the cap clipped or refused it) is each node's own, as for a Grant.
    Extend {
        /// The grant's token (it does not change).
        token: u64,
        /// The new lease, from this node's apply.
        lease_ms: u32,
    },
    /// Turns grant `token` of exactly `keys` from exclusive to shared on
    /// every key, in place: same token, lease and cap, so it keeps its
    /// place ahead of every waiter. Whether the token is current and its
    /// group is `keys` is decided from the replicated state, the same on
    /// every node (else nothing changes, as for a Release).
    Downgrade {
        /// The grant's keys, as named by the client.
        keys: KeyGroup,
        /// The grant's token (it does not change).
        token: u64,
    },
}

/// What applying one command did: the state machine's answer to the leader
/// (docs/cluster.md, "Replicated commands", the apply column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApplyResult {
    /// Acquired under this fencing token.
    Granted {
        /// The token allocated at apply.
        token: u64,
    },
    /// A Grant reached a key that is already held (defensive: the leader
    /// proposes grants only for free keys), or arrived before the counter
    /// was initialised. Nothing changed.
    GrantRejected,
    /// Released.
    Released,
    /// The token is not current on any named key. Nothing changed.
    NotFound,
    /// The token is current on a named key but its grant covers a different
    /// key group (`E 6`). Nothing changed.
    GroupMismatch,
    /// Expiry processed; `existed` says whether a grant was removed.
    Expired {
        /// A grant with the token was removed.
        existed: bool,
    },
    /// A [`Command::ForceRelease`] removed the grant `revoked` (every key
    /// of it).
    ForceReleased {
        /// The token that no longer holds.
        revoked: u64,
    },
    /// A [`Command::ForceRelease`] found the key free. Nothing changed.
    ForceNotHeld,
    /// A [`Command::ForceRelease`] named a token that does not hold the
    /// key; `held` does. Nothing changed.
    ForceTokenMismatch {
        /// The token holding the key.
        held: u64,
    },
    /// A [`Command::Extend`] applied: the lease moved (to the end this
    /// node computed from its apply), reached the cap, or the token was not
    /// current (then nothing changed, on every node).
    Extension {
        /// What the extension did on this node.
        outcome: ExtendOutcome,
    },
    /// A [`Command::Downgrade`] applied: the grant holds every key shared.
    Downgraded,
    /// Nothing happened (no-op entries, a repeated [`Command::Init`], bytes
    /// that do not decode).
    Noop,
}

impl Command {
    /// Appends the command's encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Command::Init { first_token } => {
                out.push(TAG_INIT);
                out.extend_from_slice(&first_token.to_be_bytes());
            }
            Command::Grant {
                keys,
                lease_ms,
                max_hold_ms,
                options,
            } if !options.is_default() => {
                out.push(TAG_GRANT_OPTIONS);
                out.extend_from_slice(&lease_ms.to_be_bytes());
                out.push(u8::from(max_hold_ms.is_some()));
                out.extend_from_slice(&max_hold_ms.unwrap_or(0).to_be_bytes());
                options.encode(out);
                put_key_group(out, keys);
            }
            Command::Grant {
                keys,
                lease_ms,
                max_hold_ms: None,
                ..
            } => {
                out.push(TAG_GRANT);
                out.extend_from_slice(&lease_ms.to_be_bytes());
                put_key_group(out, keys);
            }
            Command::Grant {
                keys,
                lease_ms,
                max_hold_ms: Some(max_hold_ms),
                ..
            } => {
                out.push(TAG_GRANT_CAPPED);
                out.extend_from_slice(&lease_ms.to_be_bytes());
                out.extend_from_slice(&max_hold_ms.to_be_bytes());
                put_key_group(out, keys);
            }
            Command::Release { keys, token } => {
                out.push(TAG_RELEASE);
                out.extend_from_slice(&token.to_be_bytes());
                put_key_group(out, keys);
            }
            Command::Expire { keys, token } => {
                out.push(TAG_EXPIRE);
                out.extend_from_slice(&token.to_be_bytes());
                put_key_group(out, keys);
            }
            Command::ForceRelease { key, token } => {
                out.push(TAG_FORCE_RELEASE);
                out.push(u8::from(token.is_some()));
                out.extend_from_slice(&token.unwrap_or(0).to_be_bytes());
                let bytes = key.as_bytes();
                // A valid key is at most 128 bytes.
                out.push(u8::try_from(bytes.len()).unwrap_or(u8::MAX));
                out.extend_from_slice(bytes);
            }
            Command::Extend { token, lease_ms } => {
                out.push(TAG_EXTEND);
                out.extend_from_slice(&token.to_be_bytes());
                out.extend_from_slice(&lease_ms.to_be_bytes());
            }
            Command::Downgrade { keys, token } => {
                out.push(TAG_DOWNGRADE);
                out.extend_from_slice(&token.to_be_bytes());
                put_key_group(out, keys);
            }
        }
    }

    /// The command's encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Sized up front: growing from empty took three allocations for a
        // one-key command, on every proposal.
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode(&mut out);
        out
    }

    /// The length of [`Command::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        let group = |keys: &KeyGroup| {
            1 + keys
                .keys()
                .iter()
                .map(|k| 1 + k.as_bytes().len())
                .sum::<usize>()
        };
        match self {
            Command::Init { .. } => 1 + 8,
            Command::Grant { keys, options, .. } if !options.is_default() => {
                1 + 4 + 1 + 4 + options.encoded_len() + group(keys)
            }
            Command::Grant {
                keys,
                max_hold_ms,
                options,
                ..
            } if !options.is_default() => {
                let _ = max_hold_ms;
                1 + 4 + 1 + 4 + options.encoded_len() + group(keys)
            }
            Command::Grant {
                keys, max_hold_ms, ..
            } => 1 + 4 + max_hold_ms.map_or(0, |_| 4) + group(keys),
            Command::Release { keys, .. }
            | Command::Expire { keys, .. }
            | Command::Downgrade { keys, .. } => 1 + 8 + group(keys),
            Command::ForceRelease { key, .. } => 1 + 1 + 8 + 1 + key.as_bytes().len(),
            Command::Extend { .. } => 1 + 8 + 4,
        }
    }

    /// Decodes exactly one command filling all of `bytes`; `None` for
    /// anything else (unknown tag, bad key group or key, trailing bytes, a
    /// first token at or above [`FIRST_TOKEN_MAX`], a force-release flag
    /// other than 0/1 or a token without its flag).
    pub fn decode(bytes: &[u8]) -> Option<Command> {
        let mut r = Reader::new(bytes);
        let command = match r.u8()? {
            TAG_INIT => {
                let first_token = r.u64()?;
                if first_token >= FIRST_TOKEN_MAX {
                    return None;
                }
                Command::Init { first_token }
            }
            TAG_GRANT => {
                let lease_ms = r.u32()?;
                Command::Grant {
                    keys: r.key_group()?,
                    lease_ms,
                    max_hold_ms: None,
                    options: GrantOptions::default(),
                }
            }
            TAG_GRANT_CAPPED => {
                let lease_ms = r.u32()?;
                let max_hold_ms = r.u32()?;
                Command::Grant {
                    keys: r.key_group()?,
                    lease_ms,
                    max_hold_ms: Some(max_hold_ms),
                    options: GrantOptions::default(),
                }
            }
            TAG_GRANT_OPTIONS => {
                let lease_ms = r.u32()?;
                let has_cap = r.bool()?;
                let cap = r.u32()?;
                if !has_cap && cap != 0 {
                    // One encoding per value.
                    return None;
                }
                let options = GrantOptions::decode(&mut r)?;
                let keys = r.key_group()?;
                if options.is_default() || !options.fits(&keys) {
                    return None;
                }
                Command::Grant {
                    keys,
                    lease_ms,
                    max_hold_ms: has_cap.then_some(cap),
                    options,
                }
            }
            TAG_EXTEND => {
                let token = r.u64()?;
                let lease_ms = r.u32()?;
                Command::Extend { token, lease_ms }
            }
            TAG_RELEASE => {
                let token = r.u64()?;
                Command::Release {
                    keys: r.key_group()?,
                    token,
                }
            }
            TAG_EXPIRE => {
                let token = r.u64()?;
                Command::Expire {
                    keys: r.key_group()?,
                    token,
                }
            }
            TAG_DOWNGRADE => {
                let token = r.u64()?;
                Command::Downgrade {
                    keys: r.key_group()?,
                    token,
                }
            }
            TAG_FORCE_RELEASE => {
                let has_token = r.bool()?;
                let token = r.u64()?;
                if !has_token && token != 0 {
                    // One encoding per value.
                    return None;
                }
                let len = usize::from(r.u8()?);
                let key = Key::new(r.bytes(len)?).ok()?;
                Command::ForceRelease {
                    key,
                    token: has_token.then_some(token),
                }
            }
            _ => return None,
        };
        r.is_empty().then_some(command)
    }
}

#[cfg(test)]
mod tests {
    use super::{Command, GrantOptions};
    use crate::wire::{Key, KeyGroup, LeaderLabel};

    fn key(text: &str) -> Key {
        Key::new(text.as_bytes()).unwrap()
    }

    #[test]
    fn encoded_len_is_the_length_of_every_kind_of_encoding() {
        let long = "k".repeat(100);
        let many = KeyGroup::new(vec![key("a"), key("bb"), key(&long)]).unwrap();
        let one = KeyGroup::single(key("one-key"));
        let commands = [
            Command::Init { first_token: 7 },
            Command::Grant {
                keys: one.clone(),
                lease_ms: 5,
                max_hold_ms: None,
                options: GrantOptions::default(),
            },
            Command::Grant {
                keys: many.clone(),
                lease_ms: 5,
                max_hold_ms: None,
                options: GrantOptions::default(),
            },
            Command::Grant {
                keys: many.clone(),
                lease_ms: 5,
                max_hold_ms: Some(60_000),
                options: GrantOptions::default(),
            },
            Command::Grant {
                keys: many.clone(),
                lease_ms: 5,
                max_hold_ms: None,
                options: GrantOptions {
                    shared_modes: 0b101,
                    capacity: None,
                    label: LeaderLabel::new("worker-7"),
                },
            },
            Command::Grant {
                keys: many.clone(),
                lease_ms: 5,
                max_hold_ms: Some(60_000),
                options: GrantOptions {
                    capacity: Some(4),
                    ..GrantOptions::default()
                },
            },
            Command::Extend {
                token: 9,
                lease_ms: 30_000,
            },
            Command::Release {
                keys: one,
                token: 9,
            },
            Command::Expire {
                keys: many.clone(),
                token: 9,
            },
            Command::Downgrade {
                keys: many,
                token: 9,
            },
            Command::ForceRelease {
                key: key(&long),
                token: Some(3),
            },
            Command::ForceRelease {
                key: key("x"),
                token: None,
            },
        ];
        for command in commands {
            let bytes = command.to_bytes();
            assert_eq!(bytes.len(), command.encoded_len(), "{command:?}");
            assert_eq!(bytes.capacity(), bytes.len(), "sized once: {command:?}");
            assert_eq!(Command::decode(&bytes), Some(command));
        }
    }

    #[test]
    fn grant_and_other_bytes_written_before_caps_decode_as_they_did() {
        // Bytes as written before caps and extensions existed: a Grant of
        // "ab" for 1.5 s and a Release of it.
        let grant = [0x02, 0x00, 0x00, 0x05, 0xdc, 0x01, 0x02, b'a', b'b'];
        let release = [0x03, 0, 0, 0, 0, 0, 0, 0, 9, 0x01, 0x02, b'a', b'b'];
        let keys = KeyGroup::single(key("ab"));
        let decoded = Command::Grant {
            keys: keys.clone(),
            lease_ms: 1_500,
            max_hold_ms: None,
            options: GrantOptions::default(),
        };
        assert_eq!(Command::decode(&grant), Some(decoded.clone()));
        // And an uncapped Grant is still written so.
        assert_eq!(decoded.to_bytes(), grant);
        assert_eq!(
            Command::decode(&release),
            Some(Command::Release { keys, token: 9 })
        );
    }

    #[test]
    fn a_capped_grant_and_an_extension_have_their_own_tags_and_layouts() {
        let capped = Command::Grant {
            keys: KeyGroup::single(key("ab")),
            lease_ms: 1_500,
            max_hold_ms: Some(60_000),
            options: GrantOptions::default(),
        };
        assert_eq!(
            capped.to_bytes(),
            [
                0x06, 0x00, 0x00, 0x05, 0xdc, 0x00, 0x00, 0xea, 0x60, 0x01, 0x02, b'a', b'b'
            ]
        );
        let extend = Command::Extend {
            token: 9,
            lease_ms: 30_000,
        };
        assert_eq!(
            extend.to_bytes(),
            [0x07, 0, 0, 0, 0, 0, 0, 0, 9, 0x00, 0x00, 0x75, 0x30]
        );
        // Truncated or with a trailing byte: not a command.
        let bytes = extend.to_bytes();
        assert_eq!(Command::decode(&bytes[..bytes.len() - 1]), None);
        let mut longer = bytes;
        longer.push(0);
        assert_eq!(Command::decode(&longer), None);
    }

    #[test]
    fn a_downgrade_has_tag_0x09_and_the_layout_of_a_release() {
        let downgrade = Command::Downgrade {
            keys: KeyGroup::single(key("ab")),
            token: 9,
        };
        assert_eq!(
            downgrade.to_bytes(),
            [0x09, 0, 0, 0, 0, 0, 0, 0, 9, 0x01, 0x02, b'a', b'b']
        );
        let bytes = downgrade.to_bytes();
        assert_eq!(Command::decode(&bytes[..bytes.len() - 1]), None);
    }

    #[test]
    fn a_grant_with_options_has_one_encoding_and_refuses_every_other() {
        let grant = Command::Grant {
            keys: KeyGroup::single(key("ab")),
            lease_ms: 1_500,
            max_hold_ms: None,
            options: GrantOptions {
                shared_modes: 1,
                capacity: None,
                label: LeaderLabel::new("L"),
            },
        };
        let bytes = grant.to_bytes();
        assert_eq!(
            bytes,
            [
                0x08, 0x00, 0x00, 0x05, 0xdc, 0x00, 0, 0, 0, 0, 0x00, 0x01, 0x00, 0x00, 0x01, b'L',
                0x01, 0x02, b'a', b'b'
            ]
        );
        assert_eq!(Command::decode(&bytes), Some(grant));
        let altered = |at: usize, byte: u8| {
            let mut altered = bytes.clone();
            altered[at] = byte;
            Command::decode(&altered)
        };
        // A cap value without its flag.
        assert_eq!(altered(9, 1), None);
        // A mode bit past the one key.
        assert_eq!(altered(11, 0b11), None);
        // A label with a control character.
        assert_eq!(altered(15, b'\n'), None);
        // Default options under the options tag: that grant is written 0x02.
        let mut plain = bytes[..10].to_vec();
        plain.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, b'a', b'b']);
        assert_eq!(Command::decode(&plain), None);
        // A Grant without options is still written as before they existed.
        let Command::Grant { keys, .. } = Command::decode(&bytes).unwrap() else {
            unreachable!("decoded a grant above");
        };
        let without = Command::Grant {
            keys,
            lease_ms: 1_500,
            max_hold_ms: None,
            options: GrantOptions::default(),
        };
        assert_eq!(without.to_bytes()[0], 0x02);
    }
}
