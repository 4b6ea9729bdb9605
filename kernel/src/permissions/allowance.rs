//! A principal's THINK quota is spent from allowances a node leases, a
//! chunk at a time, from a ledger: its own, or the fleet's in PostgreSQL.
//! The ledger counts what it granted in each window of the quota's period
//! and grants no more than the quota, so the nodes together never spend
//! more than they were granted, whatever their number.

/// What a quota counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Measure {
    /// Tokens, over the quota's period.
    Tokens,
    /// THINK requests, over a minute.
    Requests,
}

impl Measure {
    /// Its name in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::Tokens => "tokens",
            Measure::Requests => "requests",
        }
    }
}

/// A node asks the ledger for more of one principal's allowance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseAsk {
    /// The principal, as every node names it.
    pub owner: String,
    pub measure: Measure,
    /// The window's length: the ledger's windows are its clock's, counted
    /// from the Unix epoch.
    pub window_secs: u64,
    /// The quota: what the ledger grants in one window, to all nodes.
    pub limit: u64,
    /// What the node would like.
    pub amount: u64,
}

/// What the ledger granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The window it is of, by the ledger's clock.
    pub window: i64,
    /// At most what was asked; less when the window's quota ran out.
    pub granted: u64,
    /// Milliseconds left of the window, by the ledger's clock.
    pub ms_left: u64,
}

/// Why the ledger granted nothing: it could not be asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LedgerUnreachable(pub String);
