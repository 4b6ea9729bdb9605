//! Why the proxy refuses a request inside an intercepted tunnel, and the
//! status it answers with.

use super::body::BodyError;
use crate::request::HeadError;

/// Why a request inside an intercepted tunnel is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Head(#[from] HeadError),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error("{0} is not served inside an intercepted tunnel")]
    Method(String),
    #[error("a request for {asked} inside a tunnel to {tunnel}")]
    OtherHost { asked: String, tunnel: String },
    #[error("{0:?} is not a path, `*` for OPTIONS, or an http(s) URL of the tunnel's host")]
    Target(String),
    #[error("Connection names {0}, which every hop must keep")]
    HopByHop(String),
    #[error("Connection {0:?} is not a list of header names")]
    ConnectionList(String),
    #[error("a {0} request with a body")]
    BodyOnMethod(String),
}

impl Refusal {
    /// The HTTP status a refusal for it answers.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Head(error) => error.status(),
            _ => 400,
        }
    }
}
