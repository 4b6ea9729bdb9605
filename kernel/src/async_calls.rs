//! Asynchronous EXECs (Clove's `"async": true`): each one is a TASK of
//! its caller's, known here by the request id its caller polls for. The
//! ids are per principal — another's results never show — and each
//! result is handed over once.

use std::collections::{HashMap, VecDeque};

use agentos_proto::{ErrorCode, ErrorReply};

use crate::identity::Principal;

/// Requests one principal may have waiting to be polled.
pub const MAX_PENDING: usize = 1000;

/// One request waiting to be polled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The id its caller polls for.
    pub request_id: u64,
    /// The task that runs it.
    pub task_id: String,
}

/// Every principal's asynchronous requests not yet handed over.
#[derive(Debug, Default)]
pub struct AsyncCalls {
    pending: HashMap<Principal, VecDeque<Pending>>,
    /// The last id the kernel made.
    last_made: u64,
}

impl AsyncCalls {
    /// The id a new request of `owner` goes under: `asked`, unless one of
    /// its waiting requests has it, or the kernel's next.
    pub fn request_id(&mut self, owner: Principal, asked: Option<u64>) -> Result<u64, ErrorReply> {
        let waiting = self.pending.get(&owner).map_or(0, VecDeque::len);
        if waiting >= MAX_PENDING {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!("{MAX_PENDING} asynchronous requests wait to be polled; ASYNC_POLL them"),
            ));
        }
        match asked {
            Some(id) if self.waiting(owner, id) => Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!("EXEC field `request_id`: {id} is a request of yours still to be polled"),
            )),
            Some(id) => Ok(id),
            None => loop {
                self.last_made += 1;
                if !self.waiting(owner, self.last_made) {
                    return Ok(self.last_made);
                }
            },
        }
    }

    fn waiting(&self, owner: Principal, id: u64) -> bool {
        self.pending
            .get(&owner)
            .is_some_and(|queue| queue.iter().any(|p| p.request_id == id))
    }

    /// Records `owner`'s request `request_id`, run by `task_id`.
    pub fn add(&mut self, owner: Principal, request_id: u64, task_id: String) {
        self.pending.entry(owner).or_default().push_back(Pending {
            request_id,
            task_id,
        });
    }

    /// `owner`'s waiting requests, oldest first.
    pub fn waiting_of(&self, owner: Principal) -> Vec<Pending> {
        self.pending
            .get(&owner)
            .map(|queue| queue.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets `owner`'s request `request_id` (handed over, or its task
    /// is gone).
    pub fn remove(&mut self, owner: Principal, request_id: u64) {
        if let Some(queue) = self.pending.get_mut(&owner) {
            queue.retain(|p| p.request_id != request_id);
            if queue.is_empty() {
                self.pending.remove(&owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_per_principal_and_free_again_once_handed_over() {
        let mut calls = AsyncCalls::default();
        let (a, b) = (Principal::Agent { id: 1 }, Principal::Agent { id: 2 });
        assert_eq!(calls.request_id(a, Some(7)).unwrap(), 7);
        calls.add(a, 7, "t1".into());
        assert_eq!(
            calls.request_id(a, Some(7)).unwrap_err().code,
            ErrorCode::AlreadyExists
        );
        assert_eq!(calls.request_id(b, Some(7)).unwrap(), 7, "another's id");
        let made = calls.request_id(a, None).unwrap();
        assert_ne!(made, 7);
        assert!(calls.waiting_of(b).is_empty());
        calls.remove(a, 7);
        assert_eq!(calls.request_id(a, Some(7)).unwrap(), 7);
    }

    #[test]
    fn a_principal_has_a_bounded_number_waiting() {
        let mut calls = AsyncCalls::default();
        let a = Principal::Operator { uid: 0 };
        for n in 0..MAX_PENDING as u64 {
            let id = calls.request_id(a, None).unwrap();
            calls.add(a, id, format!("t{n}"));
        }
        assert_eq!(calls.request_id(a, None).unwrap_err().code, ErrorCode::Busy);
    }
}
