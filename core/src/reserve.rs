//! The token reserve: fencing tokens never go down, whatever the wall clock
//! does between two runs of a process.
//!
//! A server's first token is the larger of the wall-clock time and a value
//! persisted by the previous run ([`start_token`]). That value is the
//! *reserve*: the highest token the fencing domain may have issued. The
//! core never issues (single mode) or proposes (cluster mode) a token above
//! the reserve the driver has confirmed durable, and asks for the next one
//! well before it is needed: once the next token comes within half a step
//! of the reserve, [`TokenReserve::poll_persist`] asks the driver to store
//! `next_token + step`. One durable write every `step / 2` tokens.
//!
//! Contract with the driver:
//! - after every input, drain [`TokenReserve::poll_persist`] (through the
//!   machine's [`crate::machine::Output::Reserve`]): write the value
//!   durably, then
//!   report [`TokenReserve::handle_persisted`] or
//!   [`TokenReserve::handle_persist_failed`];
//! - drain [`TokenReserve::poll_alert`] (the machine's
//!   [`crate::machine::Output::Alert`]) and log each alert at `error`.
//!
//! The state file's bytes ([`encode_floor_file`], [`decode_floor_file`])
//! are decided here too, so both runtimes write the same format.

use std::collections::VecDeque;

use sha2::{Digest, Sha256};

use crate::time::{Duration, Instant};

/// Default reserve step: one durable write per 500,000 tokens.
pub const DEFAULT_RESERVE_STEP: u64 = 1_000_000;

/// Largest value a reserve may hold (and a state file may carry): tokens
/// stay below 2^63 so that no client that stores them signed ever sees one
/// go negative.
pub const RESERVE_MAX: u64 = (1 << 63) - 1;

/// How long after a failed write the reserve is asked for again.
pub const PERSIST_RETRY: Duration = Duration::from_secs(1);

/// Alerts kept for the driver at most; more are counted, not queued.
const ALERTS_MAX: usize = 64;

/// The first token of a process started `since_epoch` after the Unix epoch
/// by the wall clock, given the reserve `stored` by the previous run of the
/// same fencing domain (none on a first start): the larger of the
/// wall-clock microseconds and `stored + 1`, at least 1. So a restart
/// issues tokens above all earlier ones even if the clock went back.
pub fn start_token(since_epoch: Duration, stored: Option<u64>) -> u64 {
    let wall = crate::time::duration_micros(since_epoch).max(1);
    match stored {
        Some(stored) if reissue_reserved_token() => wall.max(stored),
        Some(stored) => wall.max(stored.saturating_add(1)),
        None => wall,
    }
}

/// The planted off-by-one (tests of the simulator's token checker only).
#[cfg(feature = "planted-bugs")]
fn reissue_reserved_token() -> bool {
    crate::testing::planted::active(crate::testing::planted::PlantedBug::ReissueReservedToken)
}

/// Without `planted-bugs` nothing is planted.
#[cfg(not(feature = "planted-bugs"))]
fn reissue_reserved_token() -> bool {
    false
}

/// Something about the token counter the operator must hear of (the driver
/// logs each at `error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenAlert {
    /// Writing the reserve failed; it is asked for again after
    /// [`PERSIST_RETRY`]. Grants stop once the reserve is used up.
    PersistFailed {
        /// The value that could not be stored.
        value: u64,
    },
    /// The next token is above the durable reserve: immediate acquires are
    /// answered `B` and queued ones wait until a write succeeds.
    Exhausted {
        /// The next token.
        next_token: u64,
        /// The durable reserve.
        reserve: u64,
    },
    /// A snapshot would have set the counter back from `current` to
    /// `snapshot`; it was refused and the node kept its state.
    SnapshotCounterBehind {
        /// This node's counter.
        current: u64,
        /// The snapshot's counter.
        snapshot: u64,
    },
}

impl core::fmt::Display for TokenAlert {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TokenAlert::PersistFailed { value } => write!(
                f,
                "could not store the token reserve {value}; grants stop when the reserve runs out"
            ),
            TokenAlert::Exhausted {
                next_token,
                reserve,
            } => write!(
                f,
                "token reserve used up (next token {next_token}, durable reserve {reserve}): \
                 acquires are refused until the state file is written"
            ),
            TokenAlert::SnapshotCounterBehind { current, snapshot } => write!(
                f,
                "refused a snapshot whose token counter {snapshot} is below this node's {current}"
            ),
        }
    }
}

/// Counts of what the reserve refused or failed, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReserveStats {
    /// The durable reserve (`u64::MAX` when unlimited).
    pub reserve: u64,
    /// Writes asked of the driver.
    pub persists_requested: u64,
    /// Writes that failed.
    pub persist_failures: u64,
    /// Times the reserve was used up.
    pub exhausted: u64,
    /// Attempts to set a token counter lower that were refused.
    pub counter_lowering_refused: u64,
}

/// The durable bound on the tokens a server or node may issue. See the
/// module documentation.
#[derive(Clone, Debug)]
pub struct TokenReserve {
    /// 0: unlimited (no state file); nothing is ever asked of the driver.
    step: u64,
    /// Tokens up to this may be issued.
    persisted: u64,
    /// A write asked of the driver and not yet answered.
    in_flight: Option<u64>,
    /// After a failure: not asked again before this.
    retry_at: Option<Instant>,
    /// The current exhaustion was already reported.
    exhausted_reported: bool,
    alerts: VecDeque<TokenAlert>,
    stats: ReserveStats,
}

impl Default for TokenReserve {
    fn default() -> Self {
        TokenReserve::unlimited()
    }
}

impl TokenReserve {
    /// No durable bound: any token may be issued (in-process servers and
    /// tests without a state directory).
    pub fn unlimited() -> Self {
        TokenReserve {
            step: 0,
            persisted: u64::MAX,
            in_flight: None,
            retry_at: None,
            exhausted_reported: false,
            alerts: VecDeque::new(),
            stats: ReserveStats::default(),
        }
    }

    /// A reserve that asks for `next_token + step` (step clamped to
    /// `2..=2^32`) whenever the next token comes within `step / 2` of the
    /// durable value; `stored` is what the previous run persisted (none on
    /// a first start). Nothing may be issued until a first write is
    /// confirmed.
    pub fn new(step: u64, stored: Option<u64>) -> Self {
        TokenReserve {
            step: step.clamp(2, 1 << 32),
            persisted: stored.unwrap_or(0).min(RESERVE_MAX),
            ..TokenReserve::unlimited()
        }
    }

    /// Whether there is no durable bound.
    pub fn is_unlimited(&self) -> bool {
        self.step == 0
    }

    /// The highest token that may be issued now.
    pub fn limit(&self) -> u64 {
        self.persisted
    }

    /// Whether `token` may be issued now.
    pub fn covers(&self, token: u64) -> bool {
        token <= self.persisted
    }

    /// The value the driver should store durably now, if any, given that
    /// tokens up to `next_token` may be needed soon. At most one write is
    /// asked for at a time.
    pub fn poll_persist(&mut self, now: Instant, next_token: u64) -> Option<u64> {
        if self.is_unlimited() {
            return None;
        }
        if next_token <= self.persisted {
            self.exhausted_reported = false;
        }
        if self.in_flight.is_some() || self.retry_at.is_some_and(|at| now < at) {
            return None;
        }
        if next_token.saturating_add(self.step / 2) <= self.persisted {
            return None;
        }
        let value = next_token.saturating_add(self.step).min(RESERVE_MAX);
        if value <= self.persisted {
            // At the ceiling: nothing more can be reserved.
            return None;
        }
        self.in_flight = Some(value);
        self.retry_at = None;
        self.stats.persists_requested += 1;
        Some(value)
    }

    /// A token above the reserve was needed (`next_token`) and refused:
    /// alerts once per episode (until the reserve covers it again).
    pub fn note_exhausted(&mut self, next_token: u64) {
        if self.exhausted_reported || self.covers(next_token) {
            return;
        }
        self.exhausted_reported = true;
        self.stats.exhausted += 1;
        self.alert(TokenAlert::Exhausted {
            next_token,
            reserve: self.persisted,
        });
    }

    /// `value` is durable. Returns whether the reserve grew (then work that
    /// waited for it may proceed).
    pub fn handle_persisted(&mut self, value: u64) -> bool {
        if self.in_flight.is_some_and(|asked| value >= asked) {
            self.in_flight = None;
        }
        if self.is_unlimited() || value <= self.persisted {
            return false;
        }
        self.persisted = value.min(RESERVE_MAX);
        true
    }

    /// The write asked for could not be made; it is asked for again after
    /// [`PERSIST_RETRY`].
    pub fn handle_persist_failed(&mut self, now: Instant) {
        let Some(value) = self.in_flight.take() else {
            return;
        };
        self.stats.persist_failures += 1;
        self.retry_at = Some(now.saturating_add(PERSIST_RETRY));
        self.alert(TokenAlert::PersistFailed { value });
    }

    /// When [`TokenReserve::poll_persist`] may have a retry to ask for.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.in_flight.is_some() {
            return None;
        }
        self.retry_at
    }

    /// The next alert for the operator.
    pub fn poll_alert(&mut self) -> Option<TokenAlert> {
        self.alerts.pop_front()
    }

    /// A token counter refused to go down (`alert` says from what to
    /// what): counted and reported.
    pub(crate) fn refused_lowering(&mut self, alert: TokenAlert) {
        self.stats.counter_lowering_refused += 1;
        self.alert(alert);
    }

    fn alert(&mut self, alert: TokenAlert) {
        if self.alerts.len() < ALERTS_MAX {
            self.alerts.push_back(alert);
        }
    }

    /// Current counts.
    pub fn stats(&self) -> ReserveStats {
        ReserveStats {
            reserve: if self.is_unlimited() {
                u64::MAX
            } else {
                self.persisted
            },
            ..self.stats
        }
    }
}

// ---------------------------------------------------------------------------
// The state file's bytes
// ---------------------------------------------------------------------------

/// First word of a state file (format version 1).
const FLOOR_MAGIC: &str = "ticketing-token-floor v1";

/// A state file that cannot be trusted. Never treated as "no file": a
/// silent reset would let tokens go down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FloorFileError {
    /// Not a token-floor file of a version we know.
    Format,
    /// The checksum does not match the value (a torn or corrupted write).
    Checksum,
    /// The value is at or above 2^63: no server ever stores that.
    Impossible(u64),
}

impl core::fmt::Display for FloorFileError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FloorFileError::Format => write!(f, "not a `{FLOOR_MAGIC}` file"),
            FloorFileError::Checksum => f.write_str("checksum mismatch (corrupted file)"),
            FloorFileError::Impossible(v) => {
                write!(f, "value {v} is impossible (at or above 2^63)")
            }
        }
    }
}

impl std::error::Error for FloorFileError {}

fn floor_checksum(value: u64) -> String {
    let digest = Sha256::digest(format!("{FLOOR_MAGIC} {value}").as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The state file's content for reserve `value`: one readable line,
/// `ticketing-token-floor v1 VALUE CHECKSUM`.
pub fn encode_floor_file(value: u64) -> Vec<u8> {
    format!("{FLOOR_MAGIC} {value} {}\n", floor_checksum(value)).into_bytes()
}

/// The reserve stored in a state file's `bytes`.
pub fn decode_floor_file(bytes: &[u8]) -> Result<u64, FloorFileError> {
    let text = std::str::from_utf8(bytes).map_err(|_| FloorFileError::Format)?;
    let line = text.strip_suffix('\n').ok_or(FloorFileError::Format)?;
    let rest = line
        .strip_prefix(FLOOR_MAGIC)
        .and_then(|rest| rest.strip_prefix(' '))
        .ok_or(FloorFileError::Format)?;
    let (value_text, checksum) = rest.split_once(' ').ok_or(FloorFileError::Format)?;
    if value_text.is_empty() || !value_text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FloorFileError::Format);
    }
    let value: u64 = value_text.parse().map_err(|_| FloorFileError::Format)?;
    if checksum != floor_checksum(value) {
        return Err(FloorFileError::Checksum);
    }
    if value > RESERVE_MAX {
        return Err(FloorFileError::Impossible(value));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_micros(ms * 1_000)
    }

    #[test]
    fn start_token_is_the_larger_of_clock_and_stored_plus_one() {
        let hour_us = 3_600_000_000;
        let now = Duration::from_micros(10 * hour_us);
        assert_eq!(start_token(now, None), 10 * hour_us);
        // The clock went back an hour: the stored reserve wins.
        let stored = 10 * hour_us + 500;
        let behind = Duration::from_micros(9 * hour_us);
        assert_eq!(start_token(behind, Some(stored)), stored + 1);
        // The clock is ahead of the stored value: the clock wins.
        assert_eq!(start_token(now, Some(5)), 10 * hour_us);
        assert_eq!(start_token(Duration::ZERO, None), 1);
        assert_eq!(start_token(Duration::ZERO, Some(u64::MAX)), u64::MAX);
    }

    #[test]
    fn persist_is_asked_within_half_a_step_and_once_at_a_time() {
        let mut reserve = TokenReserve::new(1_000, Some(10_000));
        // 10,000 - 500 = 9,500 is the last token that asks for nothing.
        assert_eq!(reserve.poll_persist(at(0), 9_500), None);
        assert_eq!(reserve.poll_persist(at(0), 9_501), Some(10_501));
        // One write at a time.
        assert_eq!(reserve.poll_persist(at(0), 9_900), None);
        assert!(reserve.handle_persisted(10_501));
        assert_eq!(reserve.limit(), 10_501);
        assert_eq!(reserve.poll_persist(at(0), 9_900), None);
        assert_eq!(reserve.poll_persist(at(0), 10_002), Some(11_002));
        assert_eq!(reserve.stats().persists_requested, 2);
    }

    #[test]
    fn a_fresh_reserve_covers_nothing_until_the_first_write() {
        let mut reserve = TokenReserve::new(1_000, None);
        assert!(!reserve.covers(1));
        let first = start_token(Duration::from_micros(5_000), None);
        assert_eq!(reserve.poll_persist(at(0), first), Some(first + 1_000));
        assert!(!reserve.covers(first));
        reserve.handle_persisted(first + 1_000);
        assert!(reserve.covers(first + 1_000));
        assert!(!reserve.covers(first + 1_001));
    }

    #[test]
    fn a_failed_write_is_retried_after_the_pause_and_alerted() {
        let mut reserve = TokenReserve::new(1_000, Some(1_000));
        assert_eq!(reserve.poll_persist(at(0), 900), Some(1_900));
        reserve.handle_persist_failed(at(10));
        assert_eq!(
            reserve.poll_alert(),
            Some(TokenAlert::PersistFailed { value: 1_900 })
        );
        assert_eq!(reserve.poll_timeout(), Some(at(1_010)));
        assert_eq!(reserve.poll_persist(at(1_009), 900), None);
        assert_eq!(reserve.poll_persist(at(1_010), 900), Some(1_900));
        assert_eq!(reserve.stats().persist_failures, 1);
        // The reserve never grew: nothing above 1,000 is covered.
        assert!(!reserve.covers(1_001));
    }

    #[test]
    fn exhaustion_is_alerted_once_per_episode() {
        let mut reserve = TokenReserve::new(1_000, Some(1_000));
        assert_eq!(reserve.poll_persist(at(0), 1_001), Some(2_001));
        reserve.note_exhausted(1_000);
        assert_eq!(reserve.poll_alert(), None, "1,000 is covered");
        reserve.note_exhausted(1_001);
        assert_eq!(
            reserve.poll_alert(),
            Some(TokenAlert::Exhausted {
                next_token: 1_001,
                reserve: 1_000
            })
        );
        reserve.note_exhausted(1_001);
        assert_eq!(reserve.poll_alert(), None, "once per episode");
        reserve.handle_persisted(2_001);
        reserve.poll_persist(at(0), 1_001);
        reserve.note_exhausted(2_002);
        assert_eq!(reserve.stats().exhausted, 2);
    }

    #[test]
    fn a_stale_or_lower_confirmation_never_lowers_the_reserve() {
        let mut reserve = TokenReserve::new(1_000, Some(5_000));
        assert!(!reserve.handle_persisted(4_000));
        assert_eq!(reserve.limit(), 5_000);
    }

    #[test]
    fn the_reserve_stops_below_two_to_the_63() {
        let mut reserve = TokenReserve::new(1_000, Some(RESERVE_MAX - 10));
        assert_eq!(
            reserve.poll_persist(at(0), RESERVE_MAX - 20),
            Some(RESERVE_MAX)
        );
        reserve.handle_persisted(RESERVE_MAX);
        assert_eq!(reserve.poll_persist(at(0), RESERVE_MAX - 5), None);
    }

    #[test]
    fn unlimited_asks_nothing_and_covers_everything() {
        let mut reserve = TokenReserve::unlimited();
        assert_eq!(reserve.poll_persist(at(0), u64::MAX - 1), None);
        assert!(reserve.covers(u64::MAX));
        assert!(!reserve.handle_persisted(5));
    }

    #[test]
    fn floor_file_round_trips_and_rejects_damage() {
        let bytes = encode_floor_file(1_764_583_491_000_000);
        assert_eq!(decode_floor_file(&bytes), Ok(1_764_583_491_000_000));
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("ticketing-token-floor v1 1764583491000000 "));

        // One digit changed: the checksum no longer matches.
        let damaged = text.replacen("1764", "1765", 1);
        assert_eq!(
            decode_floor_file(damaged.as_bytes()),
            Err(FloorFileError::Checksum)
        );
        // Truncated (a torn write), empty, or another file.
        assert_eq!(
            decode_floor_file(&bytes[..bytes.len() - 3]),
            Err(FloorFileError::Format)
        );
        assert_eq!(decode_floor_file(b""), Err(FloorFileError::Format));
        assert_eq!(
            decode_floor_file(b"hello world\n"),
            Err(FloorFileError::Format)
        );
        assert_eq!(
            decode_floor_file(b"ticketing-token-floor v1 +5 00\n"),
            Err(FloorFileError::Format)
        );
        // A well-formed file with an impossible value.
        let huge = encode_floor_file(1 << 63);
        assert_eq!(
            decode_floor_file(&huge),
            Err(FloorFileError::Impossible(1 << 63))
        );
    }
}
