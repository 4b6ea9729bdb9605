//! One execution at a time in a code context: the code interpreter runs
//! each context's executions in turn, as a Jupyter kernel does, so a
//! second `/execute` on a context waits for the first.

use std::collections::HashMap;
use std::sync::Arc;

use agentos_proto::payload::DelegateName;
use tokio::sync::Mutex;

/// Contexts remembered at most; an unused one's lock is dropped first.
const MAX_CONTEXTS: usize = 4096;

type ContextKey = (DelegateName, String, String);

/// Each context's turn.
#[derive(Debug, Default)]
pub struct ContextLocks {
    locks: HashMap<ContextKey, Arc<Mutex<()>>>,
}

impl ContextLocks {
    /// The lock of `delegate`'s context `context` in `sandbox`.
    pub fn of(&mut self, delegate: DelegateName, sandbox: &str, context: &str) -> Arc<Mutex<()>> {
        if self.locks.len() >= MAX_CONTEXTS {
            // Locks no execution holds or waits for are dropped.
            self.locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        self.locks
            .entry((delegate, sandbox.to_owned(), context.to_owned()))
            .or_default()
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_context_has_one_lock_and_unheld_ones_go_past_the_bound() {
        let mut locks = ContextLocks::default();
        let alice = DelegateName::new("e2b.alice").unwrap();
        let held = locks.of(alice, "sb", "c1");
        assert!(Arc::ptr_eq(&held, &locks.of(alice, "sb", "c1")));
        assert!(!Arc::ptr_eq(&held, &locks.of(alice, "sb", "c2")));
        for n in 0..MAX_CONTEXTS {
            drop(locks.of(alice, "sb", &format!("x{n}")));
        }
        assert!(locks.locks.len() <= MAX_CONTEXTS);
        assert!(Arc::ptr_eq(&held, &locks.of(alice, "sb", "c1")));
    }
}
