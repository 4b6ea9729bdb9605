//! A store that keeps the changes it is handed in memory and saves or
//! refuses them when the test says so: no SQLite, no thread, no sleep.

use crate::tasks::store::seam::{ReadBack, Refused, Store, Write};

/// The fake store.
#[derive(Debug, Default)]
pub struct FakeStore {
    /// Every change handed over, in order.
    pub writes: Vec<Write>,
    /// How many of them are saved.
    pub applied: u64,
    /// Refusals not yet taken.
    refused: Vec<Refused>,
    /// Whether the kernel has closed it.
    pub closed: bool,
}

impl FakeStore {
    /// Everything handed over so far is saved.
    pub fn save_all(&mut self) {
        self.applied = self.writes.len() as u64;
    }

    /// The disk fails: the new tasks among the changes not yet saved are
    /// refused because `cause`; the other changes stay unsaved.
    pub fn refuse_new_tasks(&mut self, cause: &str) {
        let tasks = self.writes[self.applied as usize..]
            .iter()
            .filter_map(|write| match write {
                Write::Insert(record) => Some(record.id.clone()),
                _ => None,
            })
            .collect();
        self.refused.push(Refused {
            tasks,
            cause: cause.to_owned(),
        });
    }

    /// The changes handed over, each as a line: `insert t-… queued`,
    /// `started t-…`, `output t-… "…"`, `finished t-… completed`,
    /// `delete t-…`.
    pub fn changes(&self) -> Vec<String> {
        self.writes
            .iter()
            .map(|write| match write {
                Write::Insert(record) => {
                    format!("insert {} {}", record.id, record.state.as_str())
                }
                Write::Started { id, .. } => format!("started {id}"),
                Write::Output { id, output } => format!("output {id} {output:?}"),
                Write::Finished { id, state, .. } => format!("finished {id} {}", state.as_str()),
                Write::Delete(ids) => format!("delete {}", ids.join(" ")),
            })
            .collect()
    }

    /// Task `id`'s result as the saved changes left it.
    fn saved_result(&self, id: &str) -> Option<Vec<u8>> {
        let mut result = None;
        for write in &self.writes[..self.applied as usize] {
            match write {
                Write::Finished {
                    id: finished,
                    result: saved,
                    ..
                } if finished == id => result = Some(saved.to_vec()),
                Write::Delete(ids) if ids.iter().any(|deleted| deleted == id) => result = None,
                _ => {}
            }
        }
        result
    }
}

impl Store for FakeStore {
    fn write(&mut self, write: Write) {
        self.writes.push(write);
    }

    fn applied(&self) -> u64 {
        self.applied
    }

    fn take_refused(&mut self) -> Vec<Refused> {
        std::mem::take(&mut self.refused)
    }

    fn read_back(&self, id: &str) -> ReadBack {
        let result = self.saved_result(id);
        ReadBack::new(move || Ok(result))
    }

    fn close(&mut self) {
        self.closed = true;
    }
}
