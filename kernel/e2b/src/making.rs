//! Sandboxes being made or woken for each key. A key's share is checked
//! against its live sandboxes and those still being made for it that
//! began earlier (and are not listed live yet), so creates at once cannot
//! take more than its share between them, and the earliest is never
//! refused for a later one.

use std::collections::{BTreeMap, HashMap};

use agentos_proto::payload::DelegateName;

/// Each key's sandboxes being made, by ticket.
#[derive(Debug, Default)]
pub struct Making {
    last: u64,
    tickets: HashMap<DelegateName, BTreeMap<u64, String>>,
}

impl Making {
    /// A ticket for sandbox `id` being made for `delegate`, and the ids
    /// of its sandboxes that began being made before it and still are.
    pub fn begin(&mut self, delegate: DelegateName, id: &str) -> (u64, Vec<String>) {
        self.last += 1;
        let tickets = self.tickets.entry(delegate).or_default();
        let earlier = tickets.values().cloned().collect();
        tickets.insert(self.last, id.to_owned());
        (self.last, earlier)
    }

    /// The sandbox of `ticket` is made, or will not be.
    pub fn end(&mut self, delegate: DelegateName, ticket: u64) {
        if let Some(tickets) = self.tickets.get_mut(&delegate) {
            tickets.remove(&ticket);
            if tickets.is_empty() {
                self.tickets.remove(&delegate);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ticket_is_given_the_earlier_ones_of_its_key_still_being_made() {
        let (alice, bob) = (
            DelegateName::new("e2b.alice").unwrap(),
            DelegateName::new("e2b.bob").unwrap(),
        );
        let mut making = Making::default();
        let (first, earlier) = making.begin(alice, "a1");
        assert!(earlier.is_empty());
        assert!(
            making.begin(bob, "b1").1.is_empty(),
            "another key's are not"
        );
        let (second, earlier) = making.begin(alice, "a2");
        assert_eq!(earlier, ["a1"]);
        making.end(alice, first);
        making.end(alice, second);
        assert!(making.begin(alice, "a3").1.is_empty());
        making.end(bob, 99);
        assert_eq!(making.tickets.len(), 2);
    }
}
