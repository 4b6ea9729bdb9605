//! Finished results in memory, up to `tasks.result_cache_bytes`: beyond
//! it the oldest leave memory — only once the store has them — and are
//! read back from the store when a `wait` asks for them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Results held in memory.
#[derive(Debug)]
pub struct ResultCache {
    results: HashMap<String, Arc<Vec<u8>>>,
    /// Results in memory, oldest first, with the write that saves each.
    order: VecDeque<(String, u64)>,
    bytes: usize,
    /// Bytes held at most, once older results are saved.
    budget: usize,
}

impl ResultCache {
    /// A cache of `budget` bytes.
    pub fn new(budget: usize) -> ResultCache {
        ResultCache {
            results: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    /// Holds task `id`'s `result`, which the store's write `saved_by`
    /// saves.
    pub fn keep(&mut self, id: &str, result: Arc<Vec<u8>>, saved_by: u64) {
        self.bytes += result.len();
        self.order.push_back((id.to_owned(), saved_by));
        self.results.insert(id.to_owned(), result);
    }

    /// Task `id`'s result, while in memory.
    pub fn get(&self, id: &str) -> Option<&[u8]> {
        self.results.get(id).map(|result| result.as_slice())
    }

    /// The results of tasks `ids`, which are gone.
    pub fn forget(&mut self, ids: &[String]) {
        let mut held = false;
        for id in ids {
            if let Some(result) = self.results.remove(id) {
                self.bytes = self.bytes.saturating_sub(result.len());
                held = true;
            }
        }
        if held {
            let gone: HashSet<&String> = ids.iter().collect();
            self.order.retain(|(id, _)| !gone.contains(id));
        }
    }

    /// Results beyond the budget leave memory, oldest first, if the store
    /// has saved them: every write up to `applied`.
    pub fn evict(&mut self, applied: u64) {
        while self.bytes > self.budget {
            let Some((_, saved_by)) = self.order.front() else {
                break;
            };
            if *saved_by > applied {
                break;
            }
            let Some((id, _)) = self.order.pop_front() else {
                break;
            };
            if let Some(result) = self.results.remove(&id) {
                self.bytes = self.bytes.saturating_sub(result.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(bytes: usize) -> Arc<Vec<u8>> {
        Arc::new(vec![b'x'; bytes])
    }

    #[test]
    fn the_oldest_results_beyond_the_budget_leave_memory_once_saved_and_not_before() {
        let mut cache = ResultCache::new(10);
        cache.keep("t-1", result(6), 1);
        cache.keep("t-2", result(6), 2);
        cache.evict(0);
        assert!(cache.get("t-1").is_some(), "unsaved, it stays");
        cache.evict(1);
        assert_eq!(cache.get("t-1"), None);
        assert_eq!(cache.get("t-2").map(<[u8]>::len), Some(6));
        // Within the budget, nothing more goes.
        cache.evict(2);
        assert!(cache.get("t-2").is_some());
    }

    #[test]
    fn a_forgotten_result_no_longer_counts_against_the_budget() {
        let mut cache = ResultCache::new(10);
        cache.keep("t-1", result(8), 1);
        cache.forget(&["t-1".to_owned()]);
        cache.keep("t-2", result(8), 2);
        cache.evict(2);
        assert!(cache.get("t-2").is_some());
        assert_eq!(cache.get("t-1"), None);
    }
}
