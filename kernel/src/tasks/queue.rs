//! Per-owner queues and caps: queued tasks wait in the order they were
//! dispatched and start while their owner has fewer than
//! `tasks.max_running_per_owner` running; a running task's work is known
//! by the number its replies come back under (`ReplyTo::Task(number)`).

use std::collections::{HashMap, VecDeque};

use super::owner::{OwnerKey, PerOwner};

/// The queue, who runs how much, and the work under way.
#[derive(Debug)]
pub struct TaskQueue {
    /// Queued ids, oldest first: those whose records are being saved wait
    /// out of it.
    order: VecDeque<String>,
    /// Queued tasks per owner, those out of `order` too.
    queued: PerOwner,
    /// Running tasks per owner.
    running: PerOwner,
    /// Running tasks by the number their work replies under.
    work: HashMap<u64, String>,
    next_number: u64,
}

impl Default for TaskQueue {
    fn default() -> Self {
        TaskQueue {
            order: VecDeque::new(),
            queued: PerOwner::default(),
            running: PerOwner::default(),
            work: HashMap::new(),
            next_number: 1,
        }
    }
}

impl TaskQueue {
    /// How many tasks `owner` has queued.
    pub fn queued(&self, owner: OwnerKey) -> usize {
        self.queued.of(owner)
    }

    /// How many tasks wait in the queue.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// The queued ids, oldest first.
    pub fn order(&self) -> impl Iterator<Item = &String> {
        self.order.iter()
    }

    /// Queues `owner`'s task `id`, last.
    pub fn push(&mut self, id: String, owner: OwnerKey) {
        self.order.push_back(id);
        self.queued.add(owner);
    }

    /// Takes queued task `id` out of the order (it stays queued) until
    /// [`TaskQueue::put_back`].
    pub fn set_aside(&mut self, id: &str) {
        if self.order.back().is_some_and(|last| last == id) {
            self.order.pop_back();
        } else {
            self.order.retain(|queued| queued != id);
        }
    }

    /// A task set aside goes back in the order, last.
    pub fn put_back(&mut self, id: String) {
        self.order.push_back(id);
    }

    /// `owner`'s queued task `id` leaves the queue without starting.
    pub fn withdraw(&mut self, id: &str, owner: OwnerKey) {
        self.order.retain(|queued| queued != id);
        self.queued.remove(owner);
    }

    /// The order, taken to look for tasks to start; what does not start
    /// is given back with [`TaskQueue::give_back`].
    pub fn take_order(&mut self) -> VecDeque<String> {
        std::mem::take(&mut self.order)
    }

    /// The tasks that did not start, in their order.
    pub fn give_back(&mut self, order: VecDeque<String>) {
        self.order = order;
    }

    /// Whether `owner` has fewer than `max_running` tasks running.
    pub fn has_room(&self, owner: OwnerKey, max_running: usize) -> bool {
        self.running.of(owner) < max_running
    }

    /// `owner`'s queued task `id` starts: returns the number its work
    /// replies under.
    pub fn start(&mut self, id: &str, owner: OwnerKey) -> u64 {
        self.running.add(owner);
        self.queued.remove(owner);
        let number = self.next_number;
        self.next_number += 1;
        self.work.insert(number, id.to_owned());
        number
    }

    /// One of `owner`'s running tasks has ended.
    pub fn end_running(&mut self, owner: OwnerKey) {
        self.running.remove(owner);
    }

    /// The work numbered `number` is over; returns its task.
    pub fn end_work(&mut self, number: u64) -> Option<String> {
        self.work.remove(&number)
    }

    /// The task whose work replies under `number`.
    pub fn task_of(&self, number: u64) -> Option<&String> {
        self.work.get(&number)
    }

    /// The numbers of the work under way.
    pub fn numbers(&self) -> Vec<u64> {
        self.work.keys().copied().collect()
    }

    /// The running tasks.
    pub fn running_tasks(&self) -> Vec<String> {
        self.work.values().cloned().collect()
    }

    /// Whether any task runs.
    pub fn is_running(&self) -> bool {
        !self.work.is_empty()
    }

    /// Queued tasks per owner.
    #[cfg(test)]
    pub fn queued_per_owner(&self) -> &PerOwner {
        &self.queued
    }
}
