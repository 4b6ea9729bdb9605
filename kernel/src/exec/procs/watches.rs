//! Watches on a session's directories (`watch`): the changes its steward
//! reports (through one inotify instance), kept in the kernel per watch —
//! the latest [`EVENTS_KEPT`] of them, at most [`EVENT_BYTES_KEPT`] bytes,
//! older ones dropped and counted — for `events` to read and follow. A
//! watch lives until `unwatch`, or until its steward or session ends.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

use agentos_proto::payload::{FileEventsReply, WatchEvent};
use agentos_proto::{ErrorCode, ErrorReply};
use slab::Slab;

use crate::exec::waiting::SessionKey;

/// Watches one session may have, those asked for included.
pub const MAX_WATCHES_PER_SESSION: usize = 16;
/// Watches the kernel keeps in all.
pub const MAX_WATCHES_TOTAL: usize = 1024;
/// Events kept per watch.
pub const EVENTS_KEPT: usize = 1024;
/// Bytes of events' paths kept per watch (a path costs its bytes and 64
/// more).
pub const EVENT_BYTES_KEPT: usize = 128 << 10;

/// What one event costs against [`EVENT_BYTES_KEPT`].
fn cost(event: &WatchEvent) -> usize {
    event.path.len() + event.name.len() + 64
}

/// One watch's events.
#[derive(Debug)]
pub struct Watch {
    /// Its session.
    pub key: SessionKey,
    /// The steward's number for it: the order that made it.
    pub reference: u64,
    events: VecDeque<WatchEvent>,
    /// What `events` costs.
    bytes: usize,
    /// The offset of `events[0]`: events seen before it.
    first: u64,
    dropped: u64,
    /// Its steward or session has ended: no more will come.
    pub ended: bool,
}

impl Watch {
    /// Its name, as `watch` gives it.
    pub fn name(&self) -> String {
        format!("w-{}", self.reference)
    }

    /// Keeps `events`, dropping the oldest beyond the caps.
    pub fn push(&mut self, events: Vec<WatchEvent>) {
        for event in events {
            self.bytes += cost(&event);
            self.events.push_back(event);
            while self.events.len() > EVENTS_KEPT || self.bytes > EVENT_BYTES_KEPT {
                let Some(oldest) = self.events.pop_front() else {
                    break;
                };
                self.bytes -= cost(&oldest);
                self.first += 1;
                self.dropped += 1;
            }
        }
    }

    /// The events after offset `after` (omitted: the oldest kept; past
    /// the end: none).
    pub fn after(&self, after: Option<u64>) -> FileEventsReply {
        let end = self.first + self.events.len() as u64;
        let from = after.unwrap_or(self.first).clamp(self.first, end);
        FileEventsReply {
            success: true,
            events: (self.events.iter())
                .skip((from - self.first) as usize)
                .cloned()
                .collect(),
            offset: end,
            dropped: self.dropped,
            ended: self.ended,
        }
    }

    /// Whether a reply from `after` would carry anything (an event, or
    /// its end).
    pub fn has_news(&self, after: Option<u64>) -> bool {
        let end = self.first + self.events.len() as u64;
        self.ended || after.is_none_or(|after| after < end) && !self.events.is_empty()
    }
}

/// Every session's watches.
#[derive(Debug, Default)]
pub struct Watches {
    watches: Slab<Watch>,
}

impl Watches {
    /// Whether session `key`, with `asked` watches asked for and not yet
    /// made, may ask for another.
    pub fn may_watch(&self, key: &SessionKey, asked: usize) -> Result<(), ErrorReply> {
        let of_session = self.of(key).len() + asked;
        if of_session >= MAX_WATCHES_PER_SESSION || self.watches.len() >= MAX_WATCHES_TOTAL {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "session {:?} has {of_session} watches (at most {MAX_WATCHES_PER_SESSION} \
                     per session, {MAX_WATCHES_TOTAL} in the kernel); unwatch one",
                    key.1
                ),
            ));
        }
        Ok(())
    }

    /// A new watch of session `key`, made by order `reference`.
    pub fn add(&mut self, key: SessionKey, reference: u64) -> usize {
        self.watches.insert(Watch {
            key,
            reference,
            events: VecDeque::new(),
            bytes: 0,
            first: 0,
            dropped: 0,
            ended: false,
        })
    }

    /// Session `key`'s watch of that name.
    pub fn find(&self, key: &SessionKey, name: &str) -> Result<usize, ErrorReply> {
        let reference = name.strip_prefix("w-").and_then(|n| n.parse().ok());
        reference
            .and_then(|reference| self.by_reference(key, reference))
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::NotFound,
                    format!("session {:?} has no watch {name:?}", key.1),
                )
            })
    }

    /// Session `key`'s watch made by order `reference`.
    pub fn by_reference(&self, key: &SessionKey, reference: u64) -> Option<usize> {
        (self.watches.iter())
            .find(|(_, w)| w.reference == reference && &w.key == key)
            .map(|(id, _)| id)
    }

    /// Session `key`'s watches.
    pub fn of(&self, key: &SessionKey) -> Vec<usize> {
        (self.watches.iter())
            .filter(|(_, w)| &w.key == key)
            .map(|(id, _)| id)
            .collect()
    }

    /// Watch `id`, if it is there.
    pub fn get(&self, id: usize) -> Option<&Watch> {
        self.watches.get(id)
    }

    /// Removes watch `id`.
    pub fn remove(&mut self, id: usize) -> Option<Watch> {
        self.watches.try_remove(id)
    }
}

impl Index<usize> for Watches {
    type Output = Watch;

    fn index(&self, id: usize) -> &Watch {
        &self.watches[id]
    }
}

impl IndexMut<usize> for Watches {
    fn index_mut(&mut self, id: usize) -> &mut Watch {
        &mut self.watches[id]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Principal;
    use agentos_proto::payload::WatchEventType;

    fn key(name: &str) -> SessionKey {
        (Principal::Operator { uid: 1 }, name.to_owned())
    }

    fn event(path: &str) -> WatchEvent {
        WatchEvent {
            kind: WatchEventType::Create,
            path: path.to_owned(),
            name: path.rsplit('/').next().unwrap_or_default().to_owned(),
        }
    }

    #[test]
    fn events_are_read_by_offset_and_the_oldest_dropped_and_counted() {
        let mut watches = Watches::default();
        let id = watches.add(key("s"), 7);
        let watch = &mut watches[id];
        assert!(!watch.has_news(None) && !watch.has_news(Some(0)));
        watch.push(
            (0..EVENTS_KEPT + 10)
                .map(|n| event(&format!("/a/{n}")))
                .collect(),
        );
        let all = watch.after(None);
        assert_eq!((all.events.len(), all.dropped), (EVENTS_KEPT, 10));
        assert_eq!(all.events[0].path, "/a/10");
        assert_eq!(all.offset, (EVENTS_KEPT + 10) as u64);
        let last = watch.after(Some(all.offset - 1));
        assert_eq!(last.events.len(), 1);
        assert!(watch.after(Some(u64::MAX)).events.is_empty());
        assert!(watch.has_news(Some(3)) && !watch.has_news(Some(all.offset)));
        watch.ended = true;
        assert!(watch.has_news(Some(all.offset)));
    }

    #[test]
    fn long_paths_cost_their_bytes() {
        let mut watches = Watches::default();
        let id = watches.add(key("s"), 7);
        let long = format!("/{}", "x".repeat(4000));
        watches[id].push((0..100).map(|_| event(&long)).collect());
        let kept = watches[id].after(None);
        assert!(kept.events.len() < 20, "{}", kept.events.len());
        assert_eq!(kept.dropped as usize + kept.events.len(), 100);
    }

    #[test]
    fn a_watch_is_found_by_its_name_in_its_own_session_only() {
        let mut watches = Watches::default();
        let id = watches.add(key("s"), 7);
        assert_eq!(watches[id].name(), "w-7");
        assert_eq!(watches.find(&key("s"), "w-7").unwrap(), id);
        for (session, name) in [("other", "w-7"), ("s", "w-8"), ("s", "7"), ("s", "w-x")] {
            let err = watches.find(&key(session), name).unwrap_err();
            assert_eq!(err.code, ErrorCode::NotFound, "{session} {name}");
        }
    }

    #[test]
    fn a_session_has_at_most_its_watches_those_asked_for_counted() {
        let mut watches = Watches::default();
        for reference in 0..10 {
            watches.add(key("s"), reference);
        }
        assert!(watches.may_watch(&key("s"), 5).is_ok());
        let refused = watches.may_watch(&key("s"), 6).unwrap_err();
        assert_eq!(refused.code, ErrorCode::LimitExceeded);
        assert!(watches.may_watch(&key("t"), 0).is_ok());
    }
}
