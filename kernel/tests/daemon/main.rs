//! The daemon itself, end to end against a real agentosd: the wire
//! contract, its life as a process and a system service, clients written in
//! other languages, and everything a client may send wrong.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bad_requests;
mod connections;
mod lifecycle;
mod protocol;
mod raw_clients;
mod service;
