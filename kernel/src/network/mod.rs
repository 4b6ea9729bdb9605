//! Network egress by policy: what a sandbox may reach beyond its own
//! loopback, through the kernel's proxy.

pub mod egress;
pub mod endpoint;
pub mod gateway;
pub mod policy;
pub mod proxy;
pub mod record;
pub mod request;
pub mod sni;

pub use egress::Egress;
pub use gateway::{Endpoint, Gateway};
