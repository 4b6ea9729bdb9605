//! The warm pool: sandboxes of the default shape prepared ahead of time
//! and parked, and the owners waiting for one, oldest first. A waiting
//! owner takes the next default sandbox that comes back from the launch
//! thread, whether it was launched for it or for the pool. The pool knows
//! sandboxes only by key and owners only as values: whatever claims from
//! it (an agent's incarnation, an exec host) is the caller's business.

use std::collections::VecDeque;

/// Parked sandboxes and waiting owners.
#[derive(Debug)]
pub struct Pool<O> {
    /// Keys of parked sandboxes, oldest first.
    parked: Vec<usize>,
    /// Owners waiting for a sandbox, oldest first.
    waiting: VecDeque<O>,
    /// How many sandboxes to keep parked.
    size: usize,
}

impl<O: PartialEq> Pool<O> {
    /// An empty pool that keeps `size` sandboxes parked.
    pub fn new(size: usize) -> Pool<O> {
        Pool {
            parked: Vec::new(),
            waiting: VecDeque::new(),
            size,
        }
    }

    /// The oldest parked sandbox, taken out of the pool.
    pub fn take(&mut self) -> Option<usize> {
        (!self.parked.is_empty()).then(|| self.parked.remove(0))
    }

    /// Parks a sandbox nobody is waiting for.
    pub fn park(&mut self, key: usize) {
        self.parked.push(key);
    }

    /// Takes a sandbox out of the pool; whether it was parked.
    pub fn remove(&mut self, key: usize) -> bool {
        let parked = self.parked.contains(&key);
        self.parked.retain(|k| *k != key);
        parked
    }

    /// Empties the pool, returning what was parked.
    pub fn drain(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.parked)
    }

    /// Queues an owner for the next sandbox that comes back.
    pub fn wait(&mut self, owner: O) {
        self.waiting.push_back(owner);
    }

    /// The oldest waiting owner, out of the queue.
    pub fn next_waiting(&mut self) -> Option<O> {
        self.waiting.pop_front()
    }

    /// Takes an owner out of the queue; whether it was waiting.
    pub fn withdraw(&mut self, owner: &O) -> bool {
        match self.waiting.iter().position(|w| w == owner) {
            Some(at) => {
                self.waiting.remove(at);
                true
            }
            None => false,
        }
    }

    /// How many more sandboxes to launch for the pool, with `coming`
    /// already on their way: enough to park `size` once every waiting
    /// owner has had one.
    pub fn shortfall(&self, coming: usize) -> usize {
        let covered = self.parked.len() + coming.saturating_sub(self.waiting.len());
        self.size.saturating_sub(covered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandboxes_are_taken_oldest_first() {
        let mut pool = Pool::<u32>::new(2);
        pool.park(7);
        pool.park(3);
        assert_eq!(pool.take(), Some(7));
        assert_eq!(pool.take(), Some(3));
        assert_eq!(pool.take(), None);
    }

    #[test]
    fn owners_wait_in_order_and_can_withdraw() {
        let mut pool = Pool::new(0);
        pool.wait(1u32);
        pool.wait(2);
        pool.wait(3);
        assert!(pool.withdraw(&2));
        assert!(!pool.withdraw(&2));
        assert_eq!(pool.next_waiting(), Some(1));
        assert_eq!(pool.next_waiting(), Some(3));
        assert_eq!(pool.next_waiting(), None);
    }

    #[test]
    fn the_shortfall_counts_launches_under_way_minus_those_promised_to_waiters() {
        let mut pool = Pool::new(2);
        assert_eq!(pool.shortfall(0), 2);
        pool.park(1);
        assert_eq!(pool.shortfall(0), 1);
        assert_eq!(pool.shortfall(1), 0);
        // A launch on its way goes to the waiter first.
        pool.wait(9u32);
        assert_eq!(pool.shortfall(1), 1);
        assert!(pool.remove(1));
        assert!(!pool.remove(1));
        assert_eq!(pool.shortfall(0), 2);
    }
}
