//! `output` requests waiting for a process to print (or end), and
//! `events` requests waiting for a watch to see a change, within caps: a
//! follow holds a reply open, so one owner's cannot crowd out the
//! others'.

use std::time::Duration;

use agentos_proto::{ErrorCode, ErrorReply};
use slab::Slab;

use super::table::Table;
use super::watches::Watches;
use crate::address::{Answer, Reply, ReplyTo};
use crate::identity::Principal;

/// Follows waiting per quota owner.
pub const MAX_FOLLOWS_PER_OWNER: usize = 64;
/// How long a follow waits when it does not say.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// Follows waiting in the kernel.
pub const MAX_FOLLOWS_TOTAL: usize = 1024;

/// What a follow waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Followed {
    /// A process's output, by the process's number in the kernel.
    Output(usize),
    /// A watch's events, by the watch's number.
    Events(usize),
}

/// An `output` waiting for bytes, or an `events` for a change.
#[derive(Debug)]
pub struct Follow {
    /// What it waits on.
    pub followed: Followed,
    /// The offset it reads after.
    pub after: Option<u64>,
    /// Where its reply goes.
    pub reply_to: ReplyTo,
    /// Whose follows it counts among.
    pub quota: Principal,
}

/// Every waiting follow, each with a serial of its own: its number is
/// reused once it is answered, and its timer outlives it.
#[derive(Debug, Default)]
pub struct Follows {
    waiting: Slab<(u64, Follow)>,
    serials: u64,
}

impl Follows {
    /// Adds `follow`, if its owner and the kernel have room for it; its
    /// number and serial.
    pub fn add(&mut self, follow: Follow) -> Result<(usize, u64), ErrorReply> {
        let of_quota = (self.waiting.iter())
            .filter(|(_, (_, f))| f.quota == follow.quota)
            .count();
        if of_quota >= MAX_FOLLOWS_PER_OWNER || self.waiting.len() >= MAX_FOLLOWS_TOTAL {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "too many `output` and `events` follows wait (at most {MAX_FOLLOWS_PER_OWNER} per owner, \
                     {MAX_FOLLOWS_TOTAL} in all); retry when one is answered"
                ),
            ));
        }
        self.serials += 1;
        Ok((self.waiting.insert((self.serials, follow)), self.serials))
    }

    /// The follows of `followed`, by number.
    pub fn of(&self, followed: Followed) -> Vec<usize> {
        (self.waiting.iter())
            .filter(|(_, (_, f))| f.followed == followed)
            .map(|(id, _)| id)
            .collect()
    }

    /// Whether a follow waits on `followed`.
    pub fn waits_on(&self, followed: Followed) -> bool {
        (self.waiting.iter()).any(|(_, (_, f))| f.followed == followed)
    }

    /// Follow `id`, while it waits.
    pub fn get(&self, id: usize) -> Option<&Follow> {
        self.waiting.get(id).map(|(_, follow)| follow)
    }

    /// Takes follow `id` (it is answered).
    pub fn take(&mut self, id: usize) -> Option<Follow> {
        self.waiting.try_remove(id).map(|(_, follow)| follow)
    }

    /// Takes follow `id` if it is still the one of `serial` (its wait is
    /// over).
    pub fn take_if(&mut self, id: usize, serial: u64) -> Option<Follow> {
        match self.waiting.get(id) {
            Some((now, _)) if *now == serial => self.take(id),
            _ => None,
        }
    }

    /// Answers the follows of `followed` that now have something to say
    /// (all of them, with `all`), from what the processes and watches
    /// hold.
    pub fn answer(
        &mut self,
        followed: Followed,
        all: bool,
        held: (&Table, &Watches),
        replies: &mut Vec<Reply>,
    ) {
        for id in self.of(followed) {
            let Some(follow) = self.get(id) else {
                continue;
            };
            if let Some(answer) = news_for(held, followed, follow.after, all) {
                if let Some(follow) = self.take(id) {
                    replies.push((follow.reply_to, answer));
                }
            }
        }
    }

    /// A connection closed: its follows go unanswered.
    pub fn connection_closed(&mut self, serial: u64) {
        self.waiting
            .retain(|_, (_, f)| f.reply_to.connection() != Some(serial));
    }
}

/// What a follow of `followed` after `after` is told, from what the
/// processes and watches hold, if it has something to say (bytes,
/// events, or the end) or is answered `anyway`.
pub fn news_for(
    (table, watches): (&Table, &Watches),
    followed: Followed,
    after: Option<u64>,
    anyway: bool,
) -> Option<Answer> {
    match followed {
        Followed::Output(process) => {
            let answer = table.get(process)?.output_after(after);
            let news = !answer.chunks.is_empty() || answer.ended;
            (anyway || news).then(|| Answer::json(&answer))
        }
        Followed::Events(watch) => {
            let watch = watches.get(watch)?;
            (anyway || watch.has_news(after)).then(|| Answer::json(&watch.after(after)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ConnKey;

    fn follow(quota: Principal, serial: u64) -> Follow {
        let conn = ConnKey { index: 0, serial };
        Follow {
            followed: Followed::Output(1),
            after: None,
            reply_to: ReplyTo::Request { conn, seq: 0 },
            quota,
        }
    }

    #[test]
    fn an_owner_has_room_for_its_own_follows_only_and_a_closed_connection_drops_its() {
        let mut follows = Follows::default();
        let (alice, bob) = (
            Principal::Operator { uid: 1 },
            Principal::Operator { uid: 2 },
        );
        for _ in 0..MAX_FOLLOWS_PER_OWNER {
            follows.add(follow(alice, 7)).unwrap();
        }
        let refused = follows.add(follow(alice, 7)).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Busy);
        let (bobs, _) = follows.add(follow(bob, 8)).unwrap();
        let of_one = |follows: &Follows| follows.of(Followed::Output(1));
        assert_eq!(of_one(&follows).len(), MAX_FOLLOWS_PER_OWNER + 1);
        assert!(follows.of(Followed::Events(1)).is_empty());
        follows.connection_closed(7);
        assert_eq!(of_one(&follows), vec![bobs]);
        assert!(follows.add(follow(alice, 9)).is_ok());
    }

    #[test]
    fn a_number_reused_is_not_taken_by_the_old_serial() {
        let mut follows = Follows::default();
        let (id, old) = follows
            .add(follow(Principal::Operator { uid: 1 }, 7))
            .unwrap();
        follows.take(id);
        let (again, new) = follows
            .add(follow(Principal::Operator { uid: 1 }, 7))
            .unwrap();
        assert_eq!(again, id);
        assert!(
            follows.take_if(id, old).is_none(),
            "the old timer answers no one"
        );
        assert!(follows.take_if(id, new).is_some());
    }
}
