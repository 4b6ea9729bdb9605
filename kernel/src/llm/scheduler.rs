//! Fair queueing of THINK requests across callers.
//!
//! Every identity (an agent, or an operator's connection) has its own FIFO
//! queue — a *flow* — and a virtual token counter: the tokens it has been
//! served, divided by its weight. The next request sent is the head of the
//! backlogged flow with the smallest counter (the virtual token counter
//! scheme of "Fairness in Serving LLMs", OSDI '24). A request is charged
//! its estimate when it is sent — so one flow does not take every free
//! slot at the provider — and corrected by the provider's count when it
//! returns.
//!
//! A flow that becomes backlogged starts no lower than the *settled*
//! counters of the flows already waiting (what they have really been
//! served, without the estimates of their requests still at the provider),
//! so an idle caller banks no credit and cannot then monopolise the model —
//! and a newcomer does not start above a backlog whose in-flight estimates
//! are about to be refunded, which would let that backlog win turn after
//! turn when answers are much shorter than asked for.
//!
//! A flow may have at most a set number of requests taken and not yet
//! settled (its *cap*, see [`Scheduler::set_flow_cap`]). A flow at its cap
//! is passed over, its queue kept as it is, and the next flow in the
//! fair order goes instead: otherwise a caller with many slow requests
//! could hold every slot at the provider while a caller that the fair
//! order puts first waits for one of them to finish.
//!
//! The scheduler knows nothing of sockets, threads or time: it orders
//! requests, and [`super::Llm`] decides when one may go.

use std::collections::{HashMap, VecDeque};

/// Whose requests: the caller's identity id.
pub type FlowId = u32;

/// Counter units per token at weight 1, so integer weights divide evenly
/// enough.
const SCALE: u64 = 1_000;

/// A queued request.
#[derive(Debug)]
pub struct Waiting<T> {
    /// Unique per request, increasing: FIFO order within a flow, and the
    /// tie-break between flows with equal counters.
    pub ticket: u64,
    /// Tokens it is expected to cost.
    pub estimate: u64,
    /// What the caller of the scheduler keeps with it.
    pub item: T,
}

#[derive(Debug)]
struct Flow<T> {
    queue: VecDeque<Waiting<T>>,
    /// Weighted tokens served, in [`SCALE`] units, including what its
    /// requests at the provider were charged.
    counter: u64,
    /// The part of `counter` charged to requests still at the provider.
    outstanding: u64,
    weight: u32,
    /// Requests taken and not yet settled: a flow is kept while it has
    /// any, so the provider's count always corrects the counter it was
    /// charged to. At the scheduler's `flow_cap`, the flow is passed
    /// over.
    in_flight: u32,
}

impl<T> Flow<T> {
    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.in_flight == 0
    }

    /// What the flow has been served, its requests at the provider aside.
    fn settled(&self) -> u64 {
        self.counter - self.outstanding
    }

    /// Its next request, if it may have one more taken.
    fn eligible_head(&self, cap: u32) -> Option<&Waiting<T>> {
        if self.in_flight >= cap {
            return None;
        }
        self.queue.front()
    }
}

/// The queue is at capacity: the request that did not fit.
#[derive(Debug, PartialEq, Eq)]
pub struct Full<T>(pub T);

/// Fair queues, one per flow, with a shared capacity.
#[derive(Debug)]
pub struct Scheduler<T> {
    flows: HashMap<FlowId, Flow<T>>,
    queued: usize,
    capacity: usize,
    /// Requests a flow may have taken and not settled at once.
    flow_cap: u32,
    /// The highest settled counter any flow has reached: the scheduler's
    /// virtual time. A flow that turns backlogged while no other is starts
    /// here.
    floor: u64,
    next_ticket: u64,
}

impl<T> Scheduler<T> {
    /// Holds at most `capacity` requests from now on; those already queued
    /// stay.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Lets a flow have at most `cap` (at least 1) requests taken and not
    /// yet settled; a flow at its cap is passed over until one of them is.
    /// A lower cap than before takes no request back: a flow above it
    /// waits until it is below.
    pub fn set_flow_cap(&mut self, cap: u32) {
        self.flow_cap = cap.max(1);
    }

    /// An empty scheduler holding at most `capacity` requests, with no
    /// flow cap.
    pub fn new(capacity: usize) -> Scheduler<T> {
        Scheduler {
            flows: HashMap::new(),
            queued: 0,
            capacity,
            flow_cap: u32::MAX,
            floor: 0,
            next_ticket: 1,
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Whether `more` requests waiting elsewhere would fill it.
    pub fn is_full_with(&self, more: usize) -> bool {
        self.queued + more >= self.capacity
    }

    /// Queues a request of `flow`, which has `weight` (at least 1).
    /// Returns its ticket.
    pub fn push(
        &mut self,
        flow: FlowId,
        weight: u32,
        estimate: u64,
        item: T,
    ) -> Result<u64, Full<T>> {
        if self.queued >= self.capacity {
            return Err(Full(item));
        }
        let start = self.backlogged_minimum().unwrap_or(self.floor);
        let entry = self.flows.entry(flow).or_insert_with(|| Flow {
            queue: VecDeque::new(),
            counter: start,
            outstanding: 0,
            weight,
            in_flight: 0,
        });
        entry.weight = weight.max(1);
        if entry.queue.is_empty() && entry.settled() < start {
            entry.counter = start + entry.outstanding;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        entry.queue.push_back(Waiting {
            ticket,
            estimate,
            item,
        });
        self.queued += 1;
        Ok(ticket)
    }

    /// The request that goes next, without taking it: the head of the
    /// flow with the smallest counter among those below their cap.
    /// `None` when nothing waits, or every flow that waits is at its cap.
    pub fn peek(&self) -> Option<(FlowId, &Waiting<T>)> {
        self.flows
            .iter()
            .filter_map(|(id, flow)| {
                flow.eligible_head(self.flow_cap)
                    .map(|head| (flow.counter, head, *id))
            })
            .min_by_key(|(counter, head, _)| (*counter, head.ticket))
            .map(|(_, head, id)| (id, head))
    }

    /// Takes the request [`peek`](Self::peek) shows and charges its flow
    /// the estimate.
    pub fn pop(&mut self) -> Option<(FlowId, Waiting<T>)> {
        let (id, _) = self.peek()?;
        let flow = self.flows.get_mut(&id)?;
        let waiting = flow.queue.pop_front()?;
        self.queued -= 1;
        flow.in_flight += 1;
        let charge = weighted(waiting.estimate, flow.weight);
        flow.counter = flow.counter.saturating_add(charge);
        flow.outstanding = flow.outstanding.saturating_add(charge);
        Some((id, waiting))
    }

    /// Corrects `flow`'s counter once the provider has said what a request
    /// taken by [`pop`](Self::pop) really cost.
    pub fn settle(&mut self, flow: FlowId, estimate: u64, actual: u64) {
        if let Some(flow) = self.flows.get_mut(&flow) {
            let (charged, owed) = (
                weighted(estimate, flow.weight),
                weighted(actual, flow.weight),
            );
            let charged = charged.min(flow.outstanding);
            flow.outstanding -= charged;
            flow.counter = flow.counter.saturating_add(owed).saturating_sub(charged);
            flow.in_flight = flow.in_flight.saturating_sub(1);
            self.floor = self.floor.max(flow.settled());
        }
        self.forget_idle();
    }

    /// Removes and returns every queued request `reject` picks (those of a
    /// closed connection, or past their deadline), oldest first.
    pub fn remove_where(&mut self, mut reject: impl FnMut(&Waiting<T>) -> bool) -> Vec<Waiting<T>> {
        let mut removed = Vec::new();
        for flow in self.flows.values_mut() {
            let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                flow.queue.drain(..).partition(|w| reject(w));
            flow.queue = kept;
            removed.extend(gone);
        }
        self.queued -= removed.len();
        removed.sort_by_key(|w| w.ticket);
        self.forget_idle();
        removed
    }

    /// The smallest settled counter among backlogged flows.
    fn backlogged_minimum(&self) -> Option<u64> {
        self.flows
            .values()
            .filter(|flow| !flow.queue.is_empty())
            .map(Flow::settled)
            .min()
    }

    /// Drops idle flows that carry no debt: they would start at the floor
    /// anyway, and operator connections come and go without end. (An idle
    /// flow's counter is settled, and so at most the floor: one-shot
    /// callers leave nothing behind.)
    fn forget_idle(&mut self) {
        let floor = self.floor;
        self.flows
            .retain(|_, flow| !flow.is_idle() || flow.counter > floor);
    }
}

/// How many of `concurrency` provider slots one caller may hold: all but
/// one, so a caller whose turn comes while another's slow requests are at
/// the provider is sent at once rather than after one of them finishes.
/// (A newcomer starts no lower than the callers already waiting, so the
/// fair order puts it first; the free slot makes that order count.) With
/// one slot, that one.
pub fn flow_cap(concurrency: usize) -> u32 {
    u32::try_from(concurrency.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .max(1)
}

fn weighted(tokens: u64, weight: u32) -> u64 {
    tokens.saturating_mul(SCALE) / u64::from(weight.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slot_is_left_for_another_caller() {
        assert_eq!(flow_cap(4), 3);
        assert_eq!(flow_cap(256), 255);
        assert_eq!(flow_cap(2), 1);
        assert_eq!(flow_cap(1), 1, "a lone slot is still usable");
    }

    /// Serves `scheduler` to the end, each request costing its estimate,
    /// and returns the flows in the order they were served.
    fn drain(scheduler: &mut Scheduler<()>) -> Vec<FlowId> {
        let mut order = Vec::new();
        while let Some((flow, waiting)) = scheduler.pop() {
            scheduler.settle(flow, waiting.estimate, waiting.estimate);
            order.push(flow);
        }
        order
    }

    #[test]
    fn a_backlog_does_not_hold_up_a_newcomer() {
        let mut s = Scheduler::new(100);
        for _ in 0..30 {
            s.push(1, 1, 100, ()).unwrap();
        }
        // Flow 1 has been served twice when flow 2 arrives.
        s.pop();
        s.pop();
        s.push(2, 1, 100, ()).unwrap();
        let order = drain(&mut s);
        let position = order.iter().position(|f| *f == 2).unwrap();
        assert!(
            position <= 1,
            "flow 2 served at position {position}: {order:?}"
        );
    }

    /// One request at a time, each costing `actual`: a backlog of 30, and
    /// a newcomer arriving while one of them is at the provider. Returns
    /// how many of the backlog went before the newcomer.
    fn backlog_ahead_of_a_newcomer(actual: u64) -> usize {
        let mut s = Scheduler::new(100);
        for _ in 0..30 {
            s.push(1, 1, 300, ()).unwrap();
        }
        let (flow, w) = s.pop().unwrap();
        s.settle(flow, w.estimate, actual);
        let (flow, w) = s.pop().unwrap();
        s.push(2, 1, 300, ()).unwrap();
        s.settle(flow, w.estimate, actual);
        let mut ahead = 0;
        loop {
            let (flow, w) = s.pop().unwrap();
            s.settle(flow, w.estimate, actual);
            if flow == 2 {
                return ahead;
            }
            ahead += 1;
        }
    }

    #[test]
    fn a_newcomer_goes_next_whatever_the_usage() {
        // Answers far shorter than asked for, as they usually are...
        assert_eq!(backlog_ahead_of_a_newcomer(10), 0);
        // ...just as asked for, and far longer.
        assert_eq!(backlog_ahead_of_a_newcomer(300), 0);
        assert_eq!(backlog_ahead_of_a_newcomer(3000), 0);
    }

    #[test]
    fn equal_weights_alternate_by_tokens() {
        let mut s = Scheduler::new(100);
        for _ in 0..4 {
            s.push(1, 1, 100, ()).unwrap();
        }
        for _ in 0..8 {
            s.push(2, 1, 50, ()).unwrap();
        }
        let order = drain(&mut s);
        // Tokens served stay within one request of each other while both wait.
        let mut served = [0i64; 3];
        for flow in &order[..10] {
            served[*flow as usize] += if *flow == 1 { 100 } else { 50 };
            assert!((served[1] - served[2]).abs() <= 100, "{order:?}");
        }
    }

    #[test]
    fn weights_share_tokens_in_proportion() {
        let mut s = Scheduler::new(1000);
        for _ in 0..300 {
            s.push(1, 1, 10, ()).unwrap();
            s.push(2, 3, 10, ()).unwrap();
        }
        let order = drain(&mut s);
        let first: Vec<_> = order[..200].to_vec();
        let heavy = first.iter().filter(|f| **f == 2).count();
        assert!((145..=155).contains(&heavy), "weight 3 got {heavy} of 200");
    }

    #[test]
    fn idleness_banks_no_credit() {
        let mut s = Scheduler::new(100);
        // Flow 1 is served alone for a while.
        for _ in 0..10 {
            s.push(1, 1, 100, ()).unwrap();
        }
        drain(&mut s);
        // Then both are backlogged: flow 2 must not get ten turns in a row.
        for _ in 0..10 {
            s.push(1, 1, 100, ()).unwrap();
            s.push(2, 1, 100, ()).unwrap();
        }
        let order = drain(&mut s);
        assert!(order[..4].contains(&1), "{order:?}");
    }

    #[test]
    fn the_provider_count_corrects_the_estimate() {
        let mut s = Scheduler::new(100);
        s.push(1, 1, 500, ()).unwrap();
        s.push(2, 1, 500, ()).unwrap();
        let (first, w) = s.pop().unwrap();
        // It really cost 10 tokens, so its flow goes again before the other
        // one's second request.
        s.settle(first, w.estimate, 10);
        s.push(first, 1, 500, ()).unwrap();
        let other = if first == 1 { 2 } else { 1 };
        s.push(other, 1, 500, ()).unwrap();
        assert_eq!(s.pop().unwrap().0, other);
        assert_eq!(s.pop().unwrap().0, first);
    }

    #[test]
    fn capacity_and_removal() {
        let mut s = Scheduler::new(3);
        let a = s.push(1, 1, 1, ()).unwrap();
        s.push(1, 1, 1, ()).unwrap();
        s.push(2, 1, 1, ()).unwrap();
        assert_eq!(s.push(3, 1, 1, ()), Err(Full(())));
        let removed = s.remove_where(|w| w.ticket == a);
        assert_eq!(removed.len(), 1);
        assert_eq!(s.len(), 2);
        s.push(3, 1, 1, ()).unwrap();
        assert_eq!(drain(&mut s).len(), 3);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn one_shot_callers_leave_nothing_behind() {
        let mut s = Scheduler::new(100);
        for caller in 0..1000 {
            s.push(caller, 1, 100, ()).unwrap();
            let (flow, waiting) = s.pop().unwrap();
            s.settle(flow, waiting.estimate, 60);
        }
        assert!(s.flows.len() <= 1, "{} flows remembered", s.flows.len());
    }

    #[test]
    fn a_flow_in_flight_is_kept_and_cannot_earn_credit() {
        let mut s = Scheduler::new(100);
        // Caller 1 asks for a huge answer and gets a short one.
        s.push(1, 1, 32_000, ()).unwrap();
        let (one, big) = s.pop().unwrap();
        // Meanwhile caller 2 is served a lot, moving virtual time past 1.
        for _ in 0..400 {
            s.push(2, 1, 100, ()).unwrap();
            let (two, w) = s.pop().unwrap();
            s.settle(two, w.estimate, w.estimate);
        }
        s.push(one, 1, 100, ()).unwrap();
        s.settle(one, big.estimate, 50);
        // Both now backlogged: 1 must not get a long run of turns.
        for _ in 0..10 {
            s.push(1, 1, 100, ()).unwrap();
            s.push(2, 1, 100, ()).unwrap();
        }
        let order = drain(&mut s);
        let run = order.iter().take_while(|f| **f == 1).count();
        assert!(
            run <= 2,
            "caller 1 was served {run} times in a row: {order:?}"
        );
    }

    #[test]
    fn a_lone_flow_keeps_all_but_one_slot() {
        // Four slots at the provider: a flow may have three.
        let mut s = Scheduler::new(100);
        s.set_flow_cap(3);
        let tickets: Vec<u64> = (0..8).map(|_| s.push(1, 1, 100, ()).unwrap()).collect();
        let taken: Vec<u64> = (0..3).map(|_| s.pop().unwrap().1.ticket).collect();
        assert_eq!(taken, tickets[..3]);
        assert!(s.peek().is_none(), "a fourth request of the flow went");
        assert_eq!(s.len(), 5);
        // A newcomer takes the slot left.
        s.push(2, 1, 100, ()).unwrap();
        assert_eq!(s.pop().unwrap().0, 2);
        // Once one of its requests is settled, the flow goes on in order.
        s.settle(1, 100, 100);
        let (flow, next) = s.pop().unwrap();
        assert_eq!((flow, next.ticket), (1, tickets[3]));
        assert!(s.pop().is_none());
    }

    #[test]
    fn a_flow_at_its_cap_lets_the_next_flow_go() {
        let mut s = Scheduler::new(100);
        s.set_flow_cap(2);
        // Flow 1's weight keeps its counter far below flow 2's, so the fair
        // order always puts it first.
        let ones: Vec<u64> = (0..6).map(|_| s.push(1, 1000, 100, ()).unwrap()).collect();
        for _ in 0..3 {
            s.push(2, 1, 100, ()).unwrap();
        }
        let order: Vec<FlowId> = (0..4).map(|_| s.pop().unwrap().0).collect();
        assert_eq!(order, [1, 2, 1, 2], "flow 1 was first until its cap");
        // Both at their cap: nothing goes, and nothing is lost.
        assert!(s.peek().is_none());
        assert_eq!(s.len(), 5);
        // A slot of flow 2 frees: flow 2 goes, flow 1 still at its cap.
        s.settle(2, 100, 100);
        assert_eq!(s.pop().unwrap().0, 2);
        // Flow 1 resumes with its next request, first in the fair order again.
        s.settle(1, 100, 100);
        s.push(2, 1, 100, ()).unwrap();
        let (flow, next) = s.pop().unwrap();
        assert_eq!((flow, next.ticket), (1, ones[2]));
        // Every request of flow 1 goes in the order it came.
        let mut rest = Vec::new();
        s.set_flow_cap(u32::MAX);
        while let Some((flow, w)) = s.pop() {
            if flow == 1 {
                rest.push(w.ticket);
            }
        }
        assert_eq!(rest, ones[3..]);
    }

    #[test]
    fn a_lower_cap_takes_nothing_back() {
        let mut s = Scheduler::new(100);
        s.set_flow_cap(4);
        for _ in 0..6 {
            s.push(1, 1, 100, ()).unwrap();
        }
        for _ in 0..4 {
            s.pop().unwrap();
        }
        // The provider shrinks to two slots (a reload): the flow's four
        // calls run on, and it waits until it is below its new cap.
        s.set_flow_cap(1);
        for _ in 0..3 {
            assert!(s.pop().is_none());
            s.settle(1, 100, 100);
        }
        assert!(s.pop().is_none());
        s.settle(1, 100, 100);
        assert_eq!(s.pop().unwrap().0, 1);
        assert!(s.pop().is_none());
        assert_eq!(s.len(), 1);
    }
}
