//! The in-memory Raft log: a snapshot base (`snapshot_index`, `snapshot_term`)
//! followed by consecutive entries, plus the commit and apply cursors.

use std::collections::VecDeque;

use super::types::Entry;

/// Invariants: `snapshot_index <= applied <= committed <= last_index()`,
/// and `entries[k].index == snapshot_index + 1 + k`.
#[derive(Debug, Default)]
pub(crate) struct RaftLog {
    snapshot_index: u64,
    snapshot_term: u64,
    entries: VecDeque<Entry>,
    pub(crate) committed: u64,
    pub(crate) applied: u64,
}

impl RaftLog {
    pub(crate) fn snapshot_index(&self) -> u64 {
        self.snapshot_index
    }

    pub(crate) fn first_index(&self) -> u64 {
        self.snapshot_index + 1
    }

    pub(crate) fn last_index(&self) -> u64 {
        self.snapshot_index + self.entries.len() as u64
    }

    pub(crate) fn last_term(&self) -> u64 {
        self.entries.back().map_or(self.snapshot_term, |e| e.term)
    }

    /// The term of the entry at `index`; `None` if compacted or beyond the
    /// end.
    pub(crate) fn term(&self, index: u64) -> Option<u64> {
        if index == self.snapshot_index {
            return Some(self.snapshot_term);
        }
        self.entry(index).map(|e| e.term)
    }

    pub(crate) fn entry(&self, index: u64) -> Option<&Entry> {
        if index <= self.snapshot_index {
            return None;
        }
        let offset = usize::try_from(index - self.snapshot_index - 1).ok()?;
        self.entries.get(offset)
    }

    pub(crate) fn entries(&self) -> impl DoubleEndedIterator<Item = &Entry> {
        self.entries.iter()
    }

    pub(crate) fn matches(&self, index: u64, term: u64) -> bool {
        self.term(index) == Some(term)
    }

    /// Raft §5.4.1: a log whose last entry has a later term, or the same
    /// last term and is at least as long, is at least as up to date.
    pub(crate) fn is_up_to_date(&self, last_index: u64, last_term: u64) -> bool {
        last_term > self.last_term()
            || (last_term == self.last_term() && last_index >= self.last_index())
    }

    /// Leader-side append of one new entry.
    pub(crate) fn push(&mut self, entry: Entry) {
        assert_eq!(entry.index, self.last_index() + 1, "log gap");
        assert!(entry.term >= self.last_term(), "term went back in log");
        self.entries.push_back(entry);
    }

    /// Follower-side append: `entries` follow `prev_index`, which the caller
    /// has checked to match. Skips entries already present, truncates at the
    /// first conflict, appends the rest. Returns whether anything was
    /// truncated (configuration must then be recomputed).
    pub(crate) fn append_after(&mut self, prev_index: u64, entries: Vec<Entry>) -> bool {
        let mut truncated = false;
        for (k, entry) in entries.into_iter().enumerate() {
            let index = prev_index + 1 + k as u64;
            debug_assert_eq!(entry.index, index);
            if index <= self.snapshot_index {
                // Already covered by our snapshot, hence committed and
                // identical on every node (state machine safety).
                continue;
            }
            match self.term(index) {
                Some(term) if term == entry.term => continue,
                Some(_) => {
                    // Log matching: a conflict means our suffix from here was
                    // never committed (a committed entry is on a majority and
                    // every later leader holds it). Truncating a committed
                    // entry would be a safety bug, so assert it.
                    assert!(
                        index > self.committed,
                        "conflict at committed index {index} (committed {})",
                        self.committed
                    );
                    self.entries
                        .truncate((index - self.snapshot_index - 1) as usize);
                    truncated = true;
                    self.entries.push_back(entry);
                }
                None => self.entries.push_back(entry),
            }
        }
        truncated
    }

    /// Up to `count_max` entries from `from`, stopping before `bytes_max`
    /// is exceeded (but always at least one entry when one exists).
    pub(crate) fn slice(&self, from: u64, count_max: usize, bytes_max: usize) -> Vec<Entry> {
        // Sized once for what the log holds (the byte bound may stop it
        // earlier): growing it took several reallocations per append.
        let available = if from < self.first_index() {
            0
        } else {
            (self.last_index() + 1).saturating_sub(from)
        };
        let mut out = Vec::with_capacity(count_max.min(usize::try_from(available).unwrap_or(0)));
        let mut bytes = 0usize;
        let mut index = from;
        while out.len() < count_max {
            let Some(entry) = self.entry(index) else {
                break;
            };
            bytes = bytes.saturating_add(entry.size_bytes());
            if !out.is_empty() && bytes > bytes_max {
                break;
            }
            out.push(entry.clone());
            index += 1;
        }
        out
    }

    /// Moves the commit index forward (never back).
    pub(crate) fn commit_to(&mut self, index: u64) -> bool {
        if index <= self.committed {
            return false;
        }
        assert!(
            index <= self.last_index(),
            "commit {index} beyond last index {}",
            self.last_index()
        );
        self.committed = index;
        true
    }

    /// Drops entries up to and including `index` (which must be applied).
    pub(crate) fn compact_to(&mut self, index: u64) {
        assert!(index <= self.applied && index > self.snapshot_index);
        let term = self.term(index).expect("compaction point in log");
        let drop_count = (index - self.snapshot_index) as usize;
        self.entries.drain(..drop_count);
        self.snapshot_index = index;
        self.snapshot_term = term;
    }

    /// Replaces the whole log by a snapshot base.
    pub(crate) fn restore(&mut self, index: u64, term: u64) {
        assert!(index > self.committed, "restore behind commit");
        self.entries.clear();
        self.snapshot_index = index;
        self.snapshot_term = term;
        self.committed = index;
        self.applied = index;
    }

    /// The largest index `<= index` whose term is `<= term` (or the snapshot
    /// base). Used for the fast back-off of a rejected append: everything
    /// after the returned index has a term above `term` and therefore cannot
    /// match an entry of term `term` in the other log.
    pub(crate) fn find_conflict_by_term(&self, index: u64, term: u64) -> u64 {
        let mut i = index.min(self.last_index());
        while i > self.snapshot_index {
            match self.term(i) {
                Some(t) if t > term => i -= 1,
                _ => break,
            }
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::types::EntryKind;

    fn e(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            kind: EntryKind::Noop,
        }
    }

    fn log_with_terms(terms: &[u64]) -> RaftLog {
        let mut log = RaftLog::default();
        for (k, &t) in terms.iter().enumerate() {
            log.push(e(k as u64 + 1, t));
        }
        log
    }

    #[test]
    fn append_after_skips_matching_entries_and_truncates_at_the_first_conflict() {
        let mut log = log_with_terms(&[1, 1, 2, 2]);
        assert!(!log.append_after(1, vec![e(2, 1), e(3, 2)]));
        assert_eq!(
            log.last_index(),
            4,
            "a shorter matching append truncates nothing"
        );
        assert!(log.append_after(2, vec![e(3, 3)]));
        assert_eq!(log.last_index(), 3);
        assert_eq!(log.term(3), Some(3));
    }

    #[test]
    #[should_panic(expected = "conflict at committed index")]
    fn truncating_a_committed_entry_is_a_bug() {
        let mut log = log_with_terms(&[1, 1, 2]);
        log.commit_to(3);
        log.append_after(2, vec![e(3, 3)]);
    }

    #[test]
    fn find_conflict_by_term_skips_entries_of_later_terms() {
        let log = log_with_terms(&[1, 1, 2, 4, 4, 5]);
        assert_eq!(log.find_conflict_by_term(6, 3), 3);
        assert_eq!(log.find_conflict_by_term(6, 5), 6);
        assert_eq!(log.find_conflict_by_term(10, 4), 5);
        assert_eq!(log.find_conflict_by_term(6, 0), 0);
    }

    #[test]
    fn compaction_keeps_terms_at_the_boundary_and_restore_resets() {
        let mut log = log_with_terms(&[1, 2, 2, 3]);
        log.commit_to(3);
        log.applied = 3;
        log.compact_to(3);
        assert_eq!(log.first_index(), 4);
        assert_eq!(log.term(3), Some(2));
        assert_eq!(log.term(2), None);
        assert_eq!(log.entry(4).map(|x| x.term), Some(3));
        assert!(log.is_up_to_date(4, 3));
        assert!(!log.is_up_to_date(9, 2));
        log.restore(10, 7);
        assert_eq!(
            (
                log.last_index(),
                log.last_term(),
                log.committed,
                log.applied
            ),
            (10, 7, 10, 10)
        );
    }

    #[test]
    fn slice_respects_count_and_bytes_but_sends_at_least_one() {
        let log = log_with_terms(&[1; 10]);
        assert_eq!(log.slice(1, 3, usize::MAX).len(), 3);
        assert_eq!(log.slice(1, 100, 1).len(), 1);
        assert_eq!(log.slice(11, 100, usize::MAX).len(), 0);
    }
}
