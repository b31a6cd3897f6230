//! The two marks a fenced resource keeps when holders may share a key
//! (docs/protocol.md §8.7, "Fencing with readers: two marks"): the rule a
//! storage applies to each operation's token, here for storage written in
//! Rust and for the simulator's resources.

/// The marks of one fenced resource: `hw_x`, the largest token of an
/// exclusive holder that acted, and `hw_all`, the largest token of any
/// holder that acted (0 before anyone did).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TwoMarks {
    /// The largest token of an exclusive holder that acted.
    pub hw_x: u64,
    /// The largest token of any holder that acted.
    pub hw_all: u64,
}

impl TwoMarks {
    /// Whether an operation with `token`, by a holder of the key in the
    /// mode `exclusive` says, is accepted; if so the marks take it in.
    ///
    /// A shared operation needs `token >= hw_x` (equal only for a writer
    /// that downgraded, since tokens are unique per grant); an exclusive
    /// one `token >= hw_all`, so a writer is refused once any later
    /// holder, reader or writer, acted.
    pub fn admit(&mut self, token: u64, exclusive: bool) -> bool {
        let floor = if exclusive && !writer_checks_writers_only() {
            self.hw_all
        } else {
            self.hw_x
        };
        if token < floor {
            return false;
        }
        self.hw_all = self.hw_all.max(token);
        if exclusive {
            self.hw_x = self.hw_x.max(token);
        }
        true
    }
}

/// The planted bug `WriterChecksWritersOnly`: an exclusive operation is
/// checked against `hw_x` alone, as a storage with one mark for writers
/// would, so a stale writer is accepted after later readers acted.
#[cfg(feature = "planted-bugs")]
fn writer_checks_writers_only() -> bool {
    crate::testing::planted::active(crate::testing::planted::PlantedBug::WriterChecksWritersOnly)
}

/// Without `planted-bugs` nothing is planted.
#[cfg(not(feature = "planted-bugs"))]
fn writer_checks_writers_only() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::TwoMarks;

    #[test]
    fn readers_pass_each_other_and_fence_off_an_older_writer() {
        let mut marks = TwoMarks::default();
        assert!(marks.admit(5, true));
        assert!(marks.admit(7, false));
        assert!(marks.admit(6, false), "two readers never fence each other");
        assert!(
            !marks.admit(5, true),
            "a writer older than a reader that acted"
        );
        assert!(
            !marks.admit(4, false),
            "a reader older than a writer that acted"
        );
        assert!(marks.admit(8, true));
        assert_eq!(marks, TwoMarks { hw_x: 8, hw_all: 8 });
    }

    #[test]
    fn a_downgraded_writer_reads_until_a_later_writer_acts() {
        let mut marks = TwoMarks::default();
        assert!(marks.admit(3, true));
        assert!(marks.admit(3, false), "the same grant, downgraded");
        assert!(marks.admit(9, true));
        assert!(!marks.admit(3, false));
    }
}
