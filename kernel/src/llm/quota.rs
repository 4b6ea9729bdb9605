//! Each principal's share of THINK (`[llm.quota]`): tokens per period
//! and requests per minute, for an operator by user name or a delegate,
//! their runs' and tasks' THINKs included.
//!
//! A THINK pays before it is queued, from what this node holds of its
//! principal's allowance in the current window; what it did not use comes
//! back when it is answered. When the node holds too little it leases a
//! chunk (a tenth of the quota, or what the THINK needs if more) from the
//! ledger — its own, or, in a fleet, the database's, through the kernel —
//! and the THINK waits, held here, in its principal's order. The ledger
//! grants no more than the quota in a window, to all nodes together, so a
//! principal's spend across the fleet stays within its quota but for what
//! providers count beyond the estimates THINKs paid.
//!
//! When the ledger grants less than asked, the window is spent: a THINK
//! the tokens left cannot cover is refused with `limit_exceeded` (one
//! they cover in part has its `max_tokens` lowered), and THINKs over the
//! request rate wait for the next minute.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::Waker;

use crate::config::llm::QuotaConfig;
use crate::permissions::allowance::{Grant, LeaseAsk, LedgerUnreachable, Measure};

/// A node leases this share of a quota at a time.
const CHUNK_DIVISOR: u64 = 10;

/// The request rate's window.
const MINUTE_SECS: u64 = 60;

/// THINKs one principal may have held for its quota at once; more are
/// refused, so one principal's wait never fills the node's queue.
const MAX_HELD_PER_PRINCIPAL: usize = 64;

/// What a quota needs of a held THINK.
pub trait Priced {
    /// Its prompt's estimated tokens.
    fn prompt_tokens(&self) -> u64;
    /// Its answer's cap, which a nearly spent quota lowers.
    fn max_tokens(&mut self) -> &mut u32;
}

/// What a THINK paid of its principal's quota, settled when it is answered.
#[derive(Clone, Debug)]
pub struct Paid {
    owner: String,
    /// Tokens paid, and the window they were paid from.
    tokens: Option<(i64, u64)>,
    /// The window the request was counted in.
    request: Option<i64>,
}

/// What offering a THINK to its quota came to.
#[derive(Debug)]
pub enum Offer<T> {
    /// Paid for: it may be queued.
    Go(T, Paid),
    /// Held until the quota allows.
    Held,
    /// Its principal's tokens are spent: why.
    Refused(T, String),
}

/// A held THINK the quotas let go, or refused.
#[derive(Debug)]
pub enum Released<T> {
    /// Paid for: it may be queued.
    Go(T, Paid),
    /// Its principal's tokens are spent: why.
    Refused(T, String),
}

/// What this node holds of one window of a quota.
#[derive(Debug, Default)]
struct Allowance {
    /// The ledger's window, once it has granted any.
    window: Option<i64>,
    /// When the window ends, by this node's clock.
    ends: Option<Instant>,
    /// Leased and not yet paid out (below zero after providers counted
    /// more than THINKs paid).
    left: i64,
    /// The ledger granted less than asked: nothing more this window.
    spent: bool,
    /// A lease is on its way.
    asking: bool,
}

impl Allowance {
    /// Starts afresh once its window has ended.
    fn roll(&mut self, now: Instant) {
        if self.ends.is_some_and(|ends| now >= ends) {
            self.restart();
        }
    }

    /// Forgets what it holds and knows of its window; a lease on its way
    /// stays on its way.
    fn restart(&mut self) {
        *self = Allowance {
            asking: self.asking,
            ..Allowance::default()
        };
    }

    fn take(&mut self, grant: Grant, asked: u64, now: Instant) {
        self.asking = false;
        if self.window != Some(grant.window) {
            self.window = Some(grant.window);
            self.left = 0;
        }
        let granted = i64::try_from(grant.granted).unwrap_or(i64::MAX);
        self.left = self.left.saturating_add(granted);
        self.spent = grant.granted < asked;
        self.ends = Some(now + Duration::from_millis(grant.ms_left));
    }

    /// Gives `amount` paid in `window` back, if that window is still this one.
    fn refund(&mut self, window: i64, amount: i64) {
        if self.window == Some(window) {
            self.left = self.left.saturating_add(amount);
        }
    }

    /// What is left, never below nothing.
    fn left(&self) -> u64 {
        u64::try_from(self.left).unwrap_or(0)
    }
}

/// One principal's allowances, and its THINKs waiting for them.
#[derive(Debug)]
struct Account<T> {
    tokens: Allowance,
    requests: Allowance,
    held: VecDeque<T>,
}

impl<T> Default for Account<T> {
    fn default() -> Self {
        Account {
            tokens: Allowance::default(),
            requests: Allowance::default(),
            held: VecDeque::new(),
        }
    }
}

impl<T> Account<T> {
    fn allowance(&mut self, measure: Measure) -> &mut Allowance {
        match measure {
            Measure::Tokens => &mut self.tokens,
            Measure::Requests => &mut self.requests,
        }
    }
}

/// What paying for a THINK came to.
enum Price {
    Paid(Paid),
    /// It waits: for these leases (none: for the request rate's next
    /// window).
    Wait(Vec<(Measure, u64)>),
    Refused(String),
}

/// The node's own ledger, when it is in no fleet: by principal and
/// measure, the window's length and number, and what it granted.
#[derive(Debug, Default)]
struct LocalLedger {
    granted: HashMap<(String, Measure), (u64, i64, u64)>,
}

impl LocalLedger {
    fn lease(&mut self, ask: &LeaseAsk) -> Grant {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        let window_ms = ask.window_secs.max(1) * 1000;
        let window = now_ms / window_ms;
        let number = i64::try_from(window).unwrap_or(i64::MAX);
        let current = (ask.window_secs, number);
        self.granted.retain(|(_, measure), (secs, at, _)| {
            *measure != ask.measure || (*secs, *at) == current
        });
        let entry = (self.granted)
            .entry((ask.owner.clone(), ask.measure))
            .or_insert((ask.window_secs, number, 0));
        let granted = ask.amount.min(ask.limit.saturating_sub(entry.2));
        entry.2 += granted;
        Grant {
            window: number,
            granted,
            ms_left: (window + 1) * window_ms - now_ms,
        }
    }
}

/// Every principal's quota on this node.
#[derive(Debug)]
pub struct Quotas<T> {
    config: QuotaConfig,
    accounts: HashMap<String, Account<T>>,
    /// The node's own ledger; `None` in a fleet, whose ledger the kernel
    /// asks (`asks`).
    local: Option<LocalLedger>,
    /// In a fleet: wakes the reactor to send the asks.
    fleet_waker: Option<Arc<Waker>>,
    asks: Vec<LeaseAsk>,
    /// Principals whose held THINKs may go now.
    ready: HashSet<String>,
}

impl<T: Priced> Quotas<T> {
    /// Quotas as `config` sets them, leased from the node's own ledger,
    /// or, given the reactor's `fleet_waker`, from the fleet's: asks go
    /// out through [`Quotas::take_asks`] (the reactor woken for them),
    /// grants come back through [`Quotas::granted`].
    pub fn new(config: &QuotaConfig, fleet_waker: Option<Arc<Waker>>) -> Quotas<T> {
        Quotas {
            config: config.clone(),
            accounts: HashMap::new(),
            local: fleet_waker.is_none().then(LocalLedger::default),
            fleet_waker,
            asks: Vec::new(),
            ready: HashSet::new(),
        }
    }

    /// Takes up new quotas (a reload): what the ledger granted in each
    /// window stands, and the ledger is asked again against the new ones.
    pub fn configure(&mut self, config: &QuotaConfig) {
        if self.config == *config {
            return;
        }
        self.config = config.clone();
        for (owner, account) in &mut self.accounts {
            account.tokens.restart();
            account.requests.restart();
            self.ready.insert(owner.clone());
        }
    }

    /// Whether any quota is set.
    pub fn is_set(&self) -> bool {
        self.config.is_set()
    }

    /// THINKs held for their quotas.
    pub fn held(&self) -> usize {
        self.accounts
            .values()
            .map(|account| account.held.len())
            .sum()
    }

    /// Pays for `item` from `owner`'s quota, or holds it until the quota
    /// allows (behind the principal's THINKs held before it).
    pub fn offer(&mut self, owner: &str, mut item: T, now: Instant) -> Offer<T> {
        let held = (self.accounts.entry(owner.to_owned()).or_default())
            .held
            .len();
        if held >= MAX_HELD_PER_PRINCIPAL {
            let why = format!(
                "{held} THINKs of {owner:?} already wait for its THINK quota; send more once \
                 they are answered"
            );
            return Offer::Refused(item, why);
        }
        if held == 0 {
            match self.price(owner, &mut item, now) {
                Price::Paid(paid) => return Offer::Go(item, paid),
                Price::Refused(why) => return Offer::Refused(item, why),
                Price::Wait(_) => {}
            }
        }
        self.held_of(owner).push_back(item);
        Offer::Held
    }

    /// Held THINKs that may go (or must be refused) now: their
    /// principals' allowances grew, came back or began a new window.
    pub fn release(&mut self, now: Instant) -> Vec<Released<T>> {
        let mut owners: Vec<String> = self.ready.drain().collect();
        owners.extend(
            (self.accounts.iter())
                .filter(|(_, account)| !account.held.is_empty() && window_over(account, now))
                .map(|(owner, _)| owner.clone()),
        );
        let mut released = Vec::new();
        for owner in owners {
            while let Some(mut item) = self.held_of(&owner).pop_front() {
                match self.price(&owner, &mut item, now) {
                    Price::Paid(paid) => released.push(Released::Go(item, paid)),
                    Price::Refused(why) => released.push(Released::Refused(item, why)),
                    Price::Wait(_) => {
                        self.held_of(&owner).push_front(item);
                        break;
                    }
                }
            }
        }
        self.forget_idle(now);
        released
    }

    /// When held THINKs wait for a window to end, the soonest end.
    pub fn next_wake(&self) -> Option<Instant> {
        (self.accounts.values())
            .filter(|account| !account.held.is_empty())
            .flat_map(|account| [account.tokens.ends, account.requests.ends])
            .flatten()
            .min()
    }

    /// Whether [`Quotas::release`] has anything to do.
    pub fn is_due(&self, now: Instant) -> bool {
        !self.ready.is_empty() || self.next_wake().is_some_and(|at| at <= now)
    }

    /// Leases for the fleet's ledger to grant.
    pub fn take_asks(&mut self) -> Vec<LeaseAsk> {
        std::mem::take(&mut self.asks)
    }

    /// The ledger granted `grant` of `ask`.
    pub fn granted(&mut self, ask: &LeaseAsk, grant: Grant, now: Instant) {
        if let Some(account) = self.accounts.get_mut(&ask.owner) {
            account.allowance(ask.measure).take(grant, ask.amount, now);
            self.ready.insert(ask.owner.clone());
        }
    }

    /// The ledger could not be asked: `ask`'s principal's held THINKs are
    /// given back, for the caller to fail, with why.
    pub fn lease_failed(
        &mut self,
        ask: &LeaseAsk,
        unreachable: &LedgerUnreachable,
    ) -> (Vec<T>, String) {
        let why = format!(
            "the THINK quota of {:?} is the fleet's, and its ledger cannot be reached: \
             {unreachable}",
            ask.owner
        );
        let Some(account) = self.accounts.get_mut(&ask.owner) else {
            return (Vec::new(), why);
        };
        account.allowance(ask.measure).asking = false;
        (account.held.drain(..).collect(), why)
    }

    /// A THINK was answered, having used `used` tokens: what it paid
    /// beyond that comes back (what it used beyond, is owed).
    pub fn settle(&mut self, paid: &Paid, used: u64) {
        let Some(account) = self.accounts.get_mut(&paid.owner) else {
            return;
        };
        if let Some((window, tokens)) = paid.tokens {
            let back = i128::from(tokens) - i128::from(used);
            let back = i64::try_from(back).unwrap_or(if back < 0 { i64::MIN } else { i64::MAX });
            account.tokens.refund(window, back);
        }
        self.ready.insert(paid.owner.clone());
    }

    /// A THINK paid for was never sent: all of it comes back.
    pub fn refund(&mut self, paid: &Paid) {
        self.settle(paid, 0);
        if let (Some(window), Some(account)) = (paid.request, self.accounts.get_mut(&paid.owner)) {
            account.requests.refund(window, 1);
        }
    }

    /// Takes the held THINKs `reject` picks out.
    pub fn remove_where(&mut self, reject: impl Fn(&T) -> bool) -> Vec<T> {
        let mut removed = Vec::new();
        for (owner, account) in &mut self.accounts {
            let (gone, kept): (VecDeque<T>, VecDeque<T>) =
                account.held.drain(..).partition(|item| reject(item));
            account.held = kept;
            if !gone.is_empty() {
                self.ready.insert(owner.clone());
            }
            removed.extend(gone);
        }
        removed
    }

    /// `owner`'s held THINKs, oldest first.
    fn held_of(&mut self, owner: &str) -> &mut VecDeque<T> {
        &mut self.accounts.entry(owner.to_owned()).or_default().held
    }

    /// Pays for `item` from what the node holds, leasing more (at once
    /// from its own ledger, or by asking the fleet's) when that is short.
    fn price(&mut self, owner: &str, item: &mut T, now: Instant) -> Price {
        loop {
            let price = self.try_price(owner, item, now);
            let Price::Wait(wants) = &price else {
                return price;
            };
            let mut granted_here = false;
            for &(measure, amount) in wants {
                let ask = LeaseAsk {
                    owner: owner.to_owned(),
                    measure,
                    window_secs: match measure {
                        Measure::Tokens => self.config.period_secs,
                        Measure::Requests => MINUTE_SECS,
                    },
                    limit: self.limit(measure),
                    amount,
                };
                let Some(account) = self.accounts.get_mut(owner) else {
                    return price;
                };
                let allowance = account.allowance(measure);
                if allowance.asking {
                    continue;
                }
                match &mut self.local {
                    Some(ledger) => {
                        allowance.take(ledger.lease(&ask), amount, now);
                        granted_here = true;
                    }
                    None => {
                        allowance.asking = true;
                        self.asks.push(ask);
                        if let Some(waker) = &self.fleet_waker {
                            if let Err(err) = waker.wake() {
                                log::error!("THINK: cannot wake the reactor: {err}");
                            }
                        }
                    }
                }
            }
            if !granted_here {
                return price;
            }
        }
    }

    /// Pays for `item` from what the node holds now, or says what it
    /// would take.
    fn try_price(&mut self, owner: &str, item: &mut T, now: Instant) -> Price {
        let config = self.config.clone();
        let Some(account) = self.accounts.get_mut(owner) else {
            return Price::Wait(Vec::new());
        };
        account.tokens.roll(now);
        account.requests.roll(now);
        let mut wants = Vec::new();
        let mut max_tokens = *item.max_tokens();
        if config.tokens > 0 {
            let prompt = item.prompt_tokens();
            let need = prompt + u64::from(max_tokens);
            let left = account.tokens.left();
            if left < need && account.tokens.spent {
                if left <= prompt {
                    let ends = account
                        .tokens
                        .ends
                        .map_or(0, |at| at.saturating_duration_since(now).as_secs().max(1));
                    return Price::Refused(format!(
                        "the THINK quota of {owner:?} ({} tokens every {} s) is spent: {left} \
                         tokens are left of it and this prompt alone needs about {prompt}; the \
                         next period begins in {ends} s",
                        config.tokens, config.period_secs
                    ));
                }
                max_tokens = u32::try_from(left - prompt).unwrap_or(u32::MAX);
            } else if left < need {
                wants.push((Measure::Tokens, chunk(config.tokens).max(need - left)));
            }
        }
        if config.rpm > 0 && account.requests.left < 1 {
            if account.requests.spent {
                return Price::Wait(wants);
            }
            wants.push((Measure::Requests, chunk(u64::from(config.rpm))));
        }
        if !wants.is_empty() {
            return Price::Wait(wants);
        }
        *item.max_tokens() = max_tokens;
        let mut paid = Paid::none(owner);
        if config.tokens > 0 {
            let cost = item.prompt_tokens() + u64::from(max_tokens);
            account.tokens.left -= i64::try_from(cost).unwrap_or(i64::MAX);
            paid.tokens = account.tokens.window.map(|window| (window, cost));
        }
        if config.rpm > 0 {
            account.requests.left -= 1;
            paid.request = account.requests.window;
        }
        Price::Paid(paid)
    }

    fn limit(&self, measure: Measure) -> u64 {
        match measure {
            Measure::Tokens => self.config.tokens,
            Measure::Requests => u64::from(self.config.rpm),
        }
    }

    /// Forgets principals with nothing held, asked or current.
    fn forget_idle(&mut self, now: Instant) {
        self.accounts.retain(|_, account| {
            !account.held.is_empty()
                || account.tokens.asking
                || account.requests.asking
                || [account.tokens.ends, account.requests.ends]
                    .into_iter()
                    .flatten()
                    .any(|ends| ends > now)
        });
    }
}

impl Paid {
    fn none(owner: &str) -> Paid {
        Paid {
            owner: owner.to_owned(),
            tokens: None,
            request: None,
        }
    }
}

/// Whether one of `account`'s windows has ended.
fn window_over<T>(account: &Account<T>, now: Instant) -> bool {
    [account.tokens.ends, account.requests.ends]
        .into_iter()
        .flatten()
        .any(|ends| ends <= now)
}

/// What a node leases of `limit` at a time.
fn chunk(limit: u64) -> u64 {
    limit.div_ceil(CHUNK_DIVISOR).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A THINK as the quotas see it.
    #[derive(Debug, PartialEq)]
    struct Think {
        prompt: u64,
        max_tokens: u32,
    }

    impl Priced for Think {
        fn prompt_tokens(&self) -> u64 {
            self.prompt
        }

        fn max_tokens(&mut self) -> &mut u32 {
            &mut self.max_tokens
        }
    }

    fn think(prompt: u64, max_tokens: u32) -> Think {
        Think { prompt, max_tokens }
    }

    fn config(tokens: u64, rpm: u32) -> QuotaConfig {
        QuotaConfig {
            tokens,
            period_secs: 3600,
            rpm,
        }
    }

    fn is_held(offer: Offer<Think>) -> bool {
        matches!(offer, Offer::Held)
    }

    fn paid(offer: Offer<Think>) -> (Think, Paid) {
        match offer {
            Offer::Go(think, paid) => (think, paid),
            other => panic!("not paid: {other:?}"),
        }
    }

    #[test]
    fn tokens_are_paid_then_answers_shrink_then_thinks_are_refused() {
        let now = Instant::now();
        let mut quotas = Quotas::new(&config(1000, 0), None);
        for _ in 0..4 {
            paid(quotas.offer("alice", think(100, 100), now));
        }
        // 800 paid: 200 left, so a 100-token prompt may answer in 100.
        let (think_5, _) = paid(quotas.offer("alice", think(100, 500), now));
        assert_eq!(think_5.max_tokens, 100);
        match quotas.offer("alice", think(10, 10), now) {
            Offer::Refused(_, why) => {
                assert!(
                    why.contains("\"alice\"") && why.contains("is spent"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        // Another principal's quota is its own.
        paid(quotas.offer("bob", think(100, 100), now));
    }

    #[test]
    fn what_an_answer_did_not_use_comes_back() {
        let now = Instant::now();
        let mut quotas = Quotas::new(&config(300, 0), None);
        let (_, first) = paid(quotas.offer("alice", think(100, 200), now));
        assert!(matches!(
            quotas.offer("alice", think(100, 200), now),
            Offer::Refused(..)
        ));
        quotas.settle(&first, 120);
        let (second, _) = paid(quotas.offer("alice", think(100, 200), now));
        assert_eq!(second.max_tokens, 80, "180 came back, 100 for the prompt");
    }

    #[test]
    fn requests_over_the_rate_wait_for_the_next_minute() {
        let now = Instant::now();
        let mut quotas = Quotas::new(&config(0, 3), None);
        for _ in 0..3 {
            paid(quotas.offer("alice", think(1, 1), now));
        }
        assert!(is_held(quotas.offer("alice", think(1, 1), now)));
        assert!(is_held(quotas.offer("alice", think(2, 2), now)));
        assert_eq!(quotas.held(), 2);
        assert!(quotas.release(now).is_empty());
        let next_minute = quotas.next_wake().expect("a window to wait for");
        assert!(next_minute <= now + Duration::from_secs(60));
        // The ledger's clock is the system's: its next minute, here, is a
        // ledger with nothing granted.
        quotas.local = Some(LocalLedger::default());
        let released = quotas.release(next_minute);
        let order: Vec<u64> = (released.iter())
            .map(|released| match released {
                Released::Go(think, _) => think.prompt,
                Released::Refused(..) => panic!("refused"),
            })
            .collect();
        assert_eq!(order, [1, 2], "in the order they came");
        assert_eq!(quotas.held(), 0);
    }

    #[test]
    fn in_a_fleet_thinks_wait_for_the_ledger_and_fail_without_it() {
        let now = Instant::now();
        let mut quotas: Quotas<Think> = Quotas::new(&config(1000, 0), Some(test_waker()));
        assert!(is_held(quotas.offer("alice", think(50, 50), now)));
        assert!(is_held(quotas.offer("alice", think(50, 50), now)));
        let asks = quotas.take_asks();
        assert_eq!(asks.len(), 1, "one ask at a time: {asks:?}");
        assert_eq!((asks[0].amount, asks[0].limit), (100, 1000), "a tenth");
        assert_eq!(asks[0].window_secs, 3600);
        // The ledger grants the 100 asked: one THINK's worth.
        let grant = Grant {
            window: 7,
            granted: 100,
            ms_left: 1000,
        };
        quotas.granted(&asks[0], grant, now);
        let released = quotas.release(now);
        assert_eq!(released.len(), 1, "100 pays for one");
        assert!(
            quotas.take_asks().len() == 1,
            "and asks again for the other"
        );
        let failed = quotas.lease_failed(&asks[0], &LedgerUnreachable("down".into()));
        assert_eq!(failed.0.len(), 1);
        assert!(failed.1.contains("down"), "{}", failed.1);
        assert_eq!(quotas.held(), 0);
    }

    #[test]
    fn a_principal_may_have_only_so_many_thinks_held() {
        let now = Instant::now();
        let mut quotas: Quotas<Think> = Quotas::new(&config(1000, 0), Some(test_waker()));
        for _ in 0..MAX_HELD_PER_PRINCIPAL {
            assert!(is_held(quotas.offer("alice", think(1, 1), now)));
        }
        match quotas.offer("alice", think(1, 1), now) {
            Offer::Refused(_, why) => assert!(why.contains("already wait"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(is_held(quotas.offer("bob", think(1, 1), now)));
    }

    #[test]
    fn a_quota_raised_by_a_reload_is_leased_at_once() {
        let now = Instant::now();
        let mut quotas = Quotas::new(&config(200, 0), None);
        paid(quotas.offer("alice", think(100, 90), now));
        assert!(matches!(
            quotas.offer("alice", think(100, 90), now),
            Offer::Refused(..)
        ));
        quotas.configure(&config(1000, 0));
        paid(quotas.offer("alice", think(100, 90), now));
    }

    #[test]
    fn the_local_ledger_grants_no_more_than_the_quota_in_a_window() {
        let mut ledger = LocalLedger::default();
        let ask = |amount| LeaseAsk {
            owner: "alice".into(),
            measure: Measure::Tokens,
            window_secs: 3600,
            limit: 250,
            amount,
        };
        let granted: Vec<u64> = [100, 100, 100, 100]
            .into_iter()
            .map(|amount| ledger.lease(&ask(amount)).granted)
            .collect();
        assert_eq!(granted, [100, 100, 50, 0]);
    }

    fn test_waker() -> Arc<Waker> {
        let poll = mio::Poll::new().expect("a poll");
        Arc::new(Waker::new(poll.registry(), mio::Token(0)).expect("a waker"))
    }
}
