//! The planted bug `PermitTokensReversed` (feature `planted-bugs`): the
//! first two permit grants of one pass over a semaphore's queue get their
//! tokens the wrong way round.

use super::LockTable;
use crate::testing::planted::{self, PlantedBug};

/// One pass over a semaphore's queue with the bug on: the first grant
/// skips the token `hole` and takes the one above it, the second takes
/// `hole`, and the counter goes on above both.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReversedPass {
    hole: u64,
}

impl ReversedPass {
    /// Starts a pass: `None` unless the bug is on.
    pub(crate) fn begin(table: &mut LockTable) -> Option<ReversedPass> {
        if !planted::active(PlantedBug::PermitTokensReversed) {
            return None;
        }
        let hole = table.next_token;
        table.next_token = hole.checked_add(1)?;
        Some(ReversedPass { hole })
    }

    /// A grant of the pass got `token`.
    pub(crate) fn granted(self, table: &mut LockTable, token: u64) {
        if token == self.hole + 1 && table.next_token == self.hole + 2 {
            table.next_token = self.hole;
        } else if token == self.hole && table.next_token == self.hole + 1 {
            table.next_token = self.hole + 2;
        }
    }

    /// The pass is over: no token of it is issued again.
    pub(crate) fn end(self, table: &mut LockTable) {
        table.next_token = table.next_token.max(self.hole + 2);
    }
}
