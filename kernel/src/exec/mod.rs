//! EXEC: agent-written code run in pooled, isolated sandboxes. Only what a
//! run prints comes back, each stream capped in fixed memory ([`output`]).
//!
//! An exec host is a sandbox whose workload is a Python zygote
//! (`zygote.py`): it keeps run children forked from its warm image, each
//! waiting for code, and hands them to the kernel over the channel its
//! claim brought ([`wire`]).

pub mod host;
pub mod output;
pub mod wire;
