//! What the processes' tokens and timers stand for.

/// What one of the processes' tokens stands for.
#[derive(Clone, Copy, Debug)]
pub enum ProcSource {
    /// A steward's socket.
    Steward(usize),
    /// A process's output pipe (0: stdout, 1: stderr).
    Output(usize, usize),
    /// A process's input, waiting for room.
    Input(usize),
}

/// Why the processes' timers fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcWake {
    /// A follow's wait is over (by number and serial).
    Follow(usize, u64),
    /// A process's timeout may have come.
    Timeout(usize),
    /// A session's records may be due to go.
    Prune,
    /// A steward's answer to an order (by steward and reference) is due.
    Answer(usize, u64),
}

/// The numbers the kernel gives its orders to stewards, one after another.
#[derive(Debug)]
pub struct Refs(u64);

impl Default for Refs {
    fn default() -> Refs {
        Refs(1)
    }
}

impl Refs {
    /// The next order's number.
    pub fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0 - 1
    }
}
