//! The agent's position in its host's command stream: how far it has taken
//! commands (asked for and handed to their lanes) and how far every command is
//! finished. Commands of different namespaces finish out of order, so the position
//! that is kept — the mark the next start reads from — is the highest sequence at
//! and below which every command taken has finished: what is finished past it is
//! asked for again after a crash and answered from the log, never carried out twice.

use std::collections::BTreeSet;

/// The mark in the log that holds the kept position.
pub const MARK: &str = "commands";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The stream sequence of the last command taken.
    taken: u64,
    /// Taken and not finished.
    open: BTreeSet<u64>,
    /// The position kept: every command at or below it is finished.
    kept: u64,
}

impl Position {
    /// From the kept position `mark` (0: from the start of the stream).
    pub fn new(mark: u64) -> Position {
        Position {
            taken: mark,
            open: BTreeSet::new(),
            kept: mark,
        }
    }

    /// Where to ask from: the commands after this one are not taken yet.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// How many commands are taken and not finished.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Takes command `seq`; false (and nothing changes) for one taken before.
    pub fn take(&mut self, seq: u64) -> bool {
        if seq <= self.taken {
            return false;
        }
        self.taken = seq;
        self.open.insert(seq);
        true
    }

    /// Command `seq` is finished; the new kept position when it moved.
    pub fn finish(&mut self, seq: u64) -> Option<u64> {
        self.open.remove(&seq);
        let kept = self
            .open
            .first()
            .map_or(self.taken, |first| first.saturating_sub(1));
        (kept > self.kept).then(|| {
            self.kept = kept;
            kept
        })
    }

    /// The position kept.
    pub fn kept(&self) -> u64 {
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_commands_finishing_out_of_order_the_kept_position_waits_for_the_first() {
        // Given a position at 10 and commands 12, 15, 20 taken
        let mut p = Position::new(10);
        assert!(p.take(12) && p.take(15) && p.take(20));
        assert_eq!((p.taken(), p.open()), (20, 3));
        // When 15 and 20 finish first, then nothing is kept past 11
        assert_eq!(p.finish(15), Some(11));
        assert_eq!(p.finish(20), None);
        assert_eq!(p.kept(), 11);
        // When 12 finishes, then everything taken is kept
        assert_eq!(p.finish(12), Some(20));
        assert_eq!((p.kept(), p.open()), (20, 0));
    }

    #[test]
    fn given_a_command_taken_before_it_is_not_taken_again() {
        let mut p = Position::new(10);
        assert!(!p.take(10));
        assert!(!p.take(3));
        assert!(p.take(11));
        assert!(!p.take(11));
        assert_eq!(p.open(), 1);
    }

    #[test]
    fn given_an_unfinished_command_a_restart_asks_for_it_again() {
        // Given 12 finished and 15 not (its lane was stopped before it began)
        let mut p = Position::new(10);
        p.take(12);
        p.take(15);
        p.finish(12);
        // Then the kept position is 14: the next start asks for 15 again
        assert_eq!(p.kept(), 14);
        assert_eq!(Position::new(p.kept()).taken(), 14);
    }
}
