//! Events (SUBSCRIBE, UNSUBSCRIBE, POLL, EMIT): what happens to agents,
//! told to the connections that asked and may see it.
//!
//! A subscription belongs to a connection and ends with it. Each has a
//! queue of its own, bounded in events and in bytes: a subscriber that
//! does not poll loses its oldest events, and its next POLL says how many
//! (`dropped`). An event is kept once however many queues hold it.
//!
//! Who may see an event is decided when it happens ([`Audience`]), the
//! way LIST decides who sees an agent: an operator the agents of its own
//! uid's tree, an agent itself and its descendants, an EXEC run the
//! agents it started and theirs. A CUSTOM event is seen as its emitter
//! is: an operator's by the connections of that uid only.
//!
//! The agents table notes what happens to agents as it happens, in a
//! bounded [`Journal`]; the hub takes those in before every request it
//! serves, so an event reaches exactly the subscriptions that existed
//! when it happened; so does the tasks table, of tasks that end. This
//! module depends on nothing else in the crate but `identity`.

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use agentos_proto::payload::{
    AgentState, EventInfo, KernelEvent, PollReply, SubscribeReply, TaskKind, TaskState, Topic,
    UnsubscribeReply, CUSTOM,
};
use serde::Serialize;

use crate::identity::Principal;

/// The most events one connection's queue holds.
pub const QUEUE_EVENTS: usize = 1000;
/// The most bytes (of event data) one connection's queue holds.
pub const QUEUE_BYTES: usize = 1 << 20;
/// The most type names one connection subscribes to.
pub const MAX_TOPICS: usize = 256;
/// What an event costs a queue besides its data.
const EVENT_OVERHEAD: usize = 128;

/// Who may see an event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Audience {
    /// The uid of the operator whose tree it happened in (none: no
    /// operator sees it).
    pub uid: Option<u32>,
    /// The agents that see it: the one it concerns (or that made it) and
    /// that agent's ancestors.
    pub agents: Vec<u32>,
    /// The EXEC run that sees it: the run whose work the agent is, or
    /// the run that made it.
    pub run: Option<u64>,
}

impl Audience {
    /// Whether `watcher` may see the event.
    pub fn admits(&self, watcher: Principal) -> bool {
        match watcher {
            Principal::Operator { uid } => self.uid == Some(uid),
            Principal::Agent { id } => self.agents.contains(&id),
            Principal::Run { number } => self.run == Some(number),
            // A delegate reaches no events.
            Principal::Delegate { .. } => false,
        }
    }
}

/// What a kernel event about an agent says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgentEventData {
    /// The agent's id.
    pub agent_id: u32,
    /// Its name.
    pub name: String,
    /// The agent that spawned it, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<u32>,
    /// Its state now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<AgentState>,
    /// How its workload exited, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Restarts so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    /// Who asked (PAUSE, RESUME), as its replies name it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<u32>,
}

/// What `TASK_ENDED` says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct TaskEventData {
    task_id: String,
    kind: TaskKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    state: TaskState,
}

/// An event that happened to an agent, before the agents table has said
/// who may see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// Its type.
    pub kind: KernelEvent,
    /// What it says.
    pub data: AgentEventData,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl Notice {
    /// A notice of `kind` about the agent `data` names, now.
    pub fn now(kind: KernelEvent, data: AgentEventData) -> Notice {
        Notice {
            kind,
            data,
            at_ms: now_ms(),
        }
    }

    /// The event, seen by `audience`.
    pub fn into_event(self, audience: Audience) -> Event {
        let data = serde_json::to_value(&self.data).unwrap_or_default();
        Event::new(self.kind.as_str(), None, data, 0, audience, self.at_ms)
    }
}

/// One event, as queues hold it.
#[derive(Debug)]
pub struct Event {
    /// What POLL shows of it.
    info: EventInfo,
    /// Who may see it.
    audience: Audience,
    /// What it costs a queue.
    cost: usize,
}

impl Event {
    /// An event of type `kind` (a kernel type, or CUSTOM with its
    /// `custom_type`) made by `source` (0: the kernel).
    pub fn new(
        kind: &str,
        custom_type: Option<String>,
        data: serde_json::Value,
        source: u32,
        audience: Audience,
        at_ms: u64,
    ) -> Event {
        let cost = EVENT_OVERHEAD
            + serde_json::to_vec(&data).map_or(0, |json| json.len())
            + custom_type.as_ref().map_or(0, String::len);
        Event {
            info: EventInfo {
                kind: kind.to_owned(),
                custom_type,
                data,
                source_agent_id: source,
                timestamp: at_ms,
            },
            audience,
            cost,
        }
    }

    /// A CUSTOM event of `custom_type`.
    pub fn custom(
        custom_type: String,
        data: serde_json::Value,
        source: u32,
        audience: Audience,
    ) -> Event {
        let data = match data {
            // Clove's readers find the type inside the data too.
            serde_json::Value::Object(mut fields) => {
                fields.insert(
                    "custom_type".to_owned(),
                    serde_json::Value::String(custom_type.clone()),
                );
                serde_json::Value::Object(fields)
            }
            other => other,
        };
        Event::new(CUSTOM, Some(custom_type), data, source, audience, now_ms())
    }

    /// `TASK_ENDED`: task `id` of `owner` ended in `state`. A task is its
    /// owner's alone, so only its owner hears of it: an operator's by the
    /// connections of its uid, an agent's by the agent, a run's by the run.
    pub fn task_ended(
        owner: Principal,
        id: &str,
        kind: TaskKind,
        label: Option<String>,
        state: TaskState,
    ) -> Event {
        let audience = match owner {
            Principal::Operator { uid } => Audience {
                uid: Some(uid),
                ..Audience::default()
            },
            Principal::Agent { id } => Audience {
                agents: vec![id],
                ..Audience::default()
            },
            Principal::Run { number } => Audience {
                run: Some(number),
                ..Audience::default()
            },
            // A delegate reaches no events: no one hears of its tasks'.
            Principal::Delegate { .. } => Audience::default(),
        };
        let data = TaskEventData {
            task_id: id.to_owned(),
            kind,
            label,
            state,
        };
        let data = serde_json::to_value(&data).unwrap_or_default();
        let kind = KernelEvent::TaskEnded.as_str();
        Event::new(kind, None, data, 0, audience, now_ms())
    }

    /// Whether a subscription to `topic` wants it.
    fn matches(&self, topic: &Topic) -> bool {
        match topic {
            Topic::Kernel(kernel) => {
                self.info.custom_type.is_none() && self.info.kind == kernel.as_str()
            }
            Topic::AnyCustom => self.info.custom_type.is_some(),
            Topic::Custom(name) => self.info.custom_type.as_deref() == Some(name.as_str()),
        }
    }
}

/// One connection's subscription.
#[derive(Debug)]
struct Subscription {
    watcher: Principal,
    topics: Vec<Topic>,
    queue: VecDeque<Arc<Event>>,
    bytes: usize,
    dropped: u64,
}

impl Subscription {
    /// Queues `event`, dropping the oldest to stay within the bounds.
    fn push(&mut self, event: Arc<Event>) {
        self.bytes += event.cost;
        self.queue.push_back(event);
        while self.queue.len() > QUEUE_EVENTS || (self.bytes > QUEUE_BYTES && self.queue.len() > 1)
        {
            if let Some(old) = self.queue.pop_front() {
                self.bytes -= old.cost;
                self.dropped += 1;
            }
        }
    }
}

/// Every connection's subscriptions, by the connection's serial.
#[derive(Debug, Default)]
pub struct Events {
    subscriptions: HashMap<u64, Subscription>,
}

/// A subscription past [`MAX_TOPICS`].
#[derive(Debug, thiserror::Error)]
#[error("a connection subscribes to at most {MAX_TOPICS} type names")]
pub struct TooManyTopics;

impl Events {
    /// Whether any connection subscribes.
    pub fn is_empty(&self) -> bool {
        self.subscriptions.is_empty()
    }

    /// Subscribes connection `serial`, which speaks for `watcher`, to
    /// `topics` as well.
    pub fn subscribe(
        &mut self,
        serial: u64,
        watcher: Principal,
        topics: Vec<Topic>,
    ) -> Result<SubscribeReply, TooManyTopics> {
        let subscription = self
            .subscriptions
            .entry(serial)
            .or_insert_with(|| Subscription {
                watcher,
                topics: Vec::new(),
                queue: VecDeque::new(),
                bytes: 0,
                dropped: 0,
            });
        let new: Vec<&Topic> = topics
            .iter()
            .filter(|t| !subscription.topics.contains(t))
            .collect();
        if subscription.topics.len() + new.len() > MAX_TOPICS {
            if subscription.topics.is_empty() {
                self.subscriptions.remove(&serial);
            }
            return Err(TooManyTopics);
        }
        subscription.topics.extend(new.into_iter().cloned());
        Ok(SubscribeReply {
            success: true,
            subscribed: topics.iter().map(|t| t.name().to_owned()).collect(),
        })
    }

    /// Ends connection `serial`'s subscriptions to `topics` (`None`: to
    /// every type, and its queue goes).
    pub fn unsubscribe(&mut self, serial: u64, topics: Option<Vec<Topic>>) -> UnsubscribeReply {
        let Some(subscription) = self.subscriptions.get_mut(&serial) else {
            return UnsubscribeReply {
                success: true,
                unsubscribed: Vec::new(),
                subscribed: Vec::new(),
            };
        };
        let gone: Vec<Topic> = match topics {
            Some(topics) => topics
                .into_iter()
                .filter(|t| subscription.topics.contains(t))
                .collect(),
            None => subscription.topics.clone(),
        };
        subscription.topics.retain(|t| !gone.contains(t));
        let subscribed = subscription
            .topics
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        if subscription.topics.is_empty() {
            self.subscriptions.remove(&serial);
        }
        UnsubscribeReply {
            success: true,
            unsubscribed: gone.iter().map(|t| t.name().to_owned()).collect(),
            subscribed,
        }
    }

    /// Queues `event` for every subscription that wants it and may see
    /// it; returns how many.
    pub fn publish(&mut self, event: Event) -> usize {
        let event = Arc::new(event);
        let mut delivered = 0;
        for subscription in self.subscriptions.values_mut() {
            if event.audience.admits(subscription.watcher)
                && subscription.topics.iter().any(|t| event.matches(t))
            {
                subscription.push(Arc::clone(&event));
                delivered += 1;
            }
        }
        delivered
    }

    /// Takes in what `journal` noted: each event published, and the
    /// events it lost counted as dropped by every subscription.
    pub fn take_in(&mut self, journal: &mut Journal) {
        let (events, lost) = journal.take();
        if self.is_empty() {
            return;
        }
        if lost > 0 {
            for subscription in self.subscriptions.values_mut() {
                subscription.dropped += lost;
            }
        }
        for event in events {
            self.publish(event);
        }
    }

    /// POLL: up to `max` of connection `serial`'s events, oldest first.
    pub fn poll(&mut self, serial: u64, max: usize) -> PollReply {
        let Some(subscription) = self.subscriptions.get_mut(&serial) else {
            return PollReply {
                success: true,
                events: Vec::new(),
                count: 0,
                dropped: 0,
                pending: 0,
            };
        };
        let take = max.min(subscription.queue.len());
        let events: Vec<EventInfo> = subscription
            .queue
            .drain(..take)
            .map(|event| {
                subscription.bytes -= event.cost;
                event.info.clone()
            })
            .collect();
        PollReply {
            success: true,
            count: events.len(),
            events,
            dropped: std::mem::take(&mut subscription.dropped),
            pending: subscription.queue.len(),
        }
    }

    /// A connection closed: its subscriptions end.
    pub fn connection_closed(&mut self, serial: u64) {
        self.subscriptions.remove(&serial);
    }
}

/// What happened, waiting for the hub to take it in: bounded, so that a
/// kernel no one asks for events keeps only the latest.
/// The most events a journal keeps between two takes.
pub const JOURNAL_EVENTS: usize = 4 * QUEUE_EVENTS;

/// Events noted and not yet taken, oldest first, and how many were lost
/// for want of room.
#[derive(Debug, Default)]
pub struct Journal {
    events: VecDeque<Event>,
    lost: u64,
}

impl Journal {
    /// Notes `event`; past [`JOURNAL_EVENTS`], the oldest is lost.
    pub fn push(&mut self, event: Event) {
        if self.events.len() >= JOURNAL_EVENTS {
            self.events.pop_front();
            self.lost += 1;
        }
        self.events.push_back(event);
    }

    /// Takes every event noted, and how many were lost since the last
    /// take.
    pub fn take(&mut self) -> (Vec<Event>, u64) {
        (
            self.events.drain(..).collect(),
            std::mem::take(&mut self.lost),
        )
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}
