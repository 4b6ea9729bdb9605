//! Sessions' records on their way to the disks' thread: at most one write
//! of a session's record waits there at a time, however often the record
//! changes meanwhile (the write takes the latest), so a client changing a
//! session's lifetime a million times in a row queues one write, not a
//! million copies of its record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::record::SessionRecord;
use crate::exec::waiting::SessionKey;
use crate::identity::Principal;

/// A record waiting to be written; `None` once the disks' thread took it.
pub type PendingRecord = Arc<Mutex<Option<SessionRecord>>>;

/// The record write waiting for each session, if one does.
#[derive(Debug, Default)]
pub struct RecordWrites {
    waiting: HashMap<SessionKey, PendingRecord>,
}

impl RecordWrites {
    /// Session `key`'s `record` is to be written: what a new write job is
    /// to carry, or `None` if one still waits (it writes this record
    /// instead of the one it was given).
    pub fn write(&mut self, key: &SessionKey, record: SessionRecord) -> Option<PendingRecord> {
        if let Some(pending) = self.waiting.get(key) {
            let mut waiting = pending.lock().unwrap_or_else(PoisonError::into_inner);
            if waiting.is_some() {
                *waiting = Some(record);
                return None;
            }
        }
        let pending = Arc::new(Mutex::new(Some(record)));
        self.waiting.insert(key.clone(), Arc::clone(&pending));
        Some(pending)
    }

    /// Session `key` is gone: nothing of it is to be written.
    pub fn forget(&mut self, key: &SessionKey) {
        if let Some(pending) = self.waiting.remove(key) {
            pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
        }
    }

    /// `owner` is gone, and its sessions with it.
    pub fn forget_owner(&mut self, owner: Principal) {
        let keys: Vec<SessionKey> = (self.waiting.keys())
            .filter(|(of, _)| *of == owner)
            .cloned()
            .collect();
        for key in keys {
            self.forget(&key);
        }
    }
}

/// The record `pending` holds, taken: the disks' thread writes it (none if
/// the session went meanwhile, or a later write took it).
pub fn take(pending: &PendingRecord) -> Option<SessionRecord> {
    pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    #[test]
    fn one_write_waits_per_session_and_it_takes_the_latest_record() {
        let mut writes = RecordWrites::default();
        let key = (Principal::Operator { uid: 0 }, "s1".to_owned());
        let record = |runs| SessionRecord {
            runs,
            ..SessionRecord::new(SystemTime::UNIX_EPOCH)
        };
        let first = writes.write(&key, record(1)).unwrap();
        for runs in 2..1000 {
            assert!(writes.write(&key, record(runs)).is_none());
        }
        assert_eq!(take(&first).map(|r| r.runs), Some(999));
        // Taken: the next change needs a write of its own.
        let second = writes.write(&key, record(1000)).unwrap();
        writes.forget(&key);
        assert!(take(&second).is_none(), "a session gone writes nothing");
    }
}
