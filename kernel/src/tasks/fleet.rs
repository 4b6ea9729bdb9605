//! The fleet's tasks this node has claimed: each runs here as a task of
//! its own, under the fleet's id, and its end goes back to the fleet.

use std::collections::HashSet;
use std::sync::Arc;

use agentos_proto::payload::TaskState;

/// A claimed task that has ended here.
#[derive(Debug)]
pub struct FleetEnd {
    pub task_id: String,
    pub state: TaskState,
    pub result: Arc<Vec<u8>>,
}

/// The claimed tasks still going, and the ends not yet handed back.
#[derive(Debug, Default)]
pub struct FleetTasks {
    going: HashSet<String>,
    ended: Vec<FleetEnd>,
}

impl FleetTasks {
    /// Task `id` is a fleet's.
    pub fn adopt(&mut self, id: String) {
        self.going.insert(id);
    }

    /// Whether task `id` is a fleet's that runs here.
    pub fn holds(&self, id: &str) -> bool {
        self.going.contains(id)
    }

    /// Task `id` has ended: if it is a fleet's, its end is kept to be
    /// handed back.
    pub fn ended(&mut self, id: &str, state: TaskState, result: &Arc<Vec<u8>>) {
        if self.going.remove(id) {
            self.ended.push(FleetEnd {
                task_id: id.to_owned(),
                state,
                result: Arc::clone(result),
            });
        }
    }

    /// The ends not yet handed back.
    pub fn take_ended(&mut self) -> Vec<FleetEnd> {
        std::mem::take(&mut self.ended)
    }
}
