//! EXEC: agent-written code run in pooled, isolated sandboxes. Only what a
//! run prints comes back, each stream capped in fixed memory ([`output`]).

pub mod output;
