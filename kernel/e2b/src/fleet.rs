//! The face in a fleet (docs/fleet.md, "Sandboxes through any node"): a
//! sandbox's id ends with its node's tag, and a request for a sandbox of
//! another node is forwarded to that node's face
//! ([`agentos_http::forward`], proven as [`agentos_http::fleet`] says).
//! The client's API key or access token still proves the tenant, as on
//! one node.

use agentos_http::fleet::{FleetFace, Peer, Wanted, TAG_LEN};
use agentos_http::kernel_link::KernelLink;

use crate::answer::ApiError;
use crate::ids::SANDBOX_ID_LEN;

/// Where a request for a sandbox is answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Holder {
    /// Here: its id names this node, or no node known.
    Here,
    /// By another node's face.
    There(Peer),
}

/// Where the sandbox `id` is held, by its id's tag.
pub async fn holder(fleet: &FleetFace, kernel: &KernelLink, id: &str) -> Result<Holder, ApiError> {
    let Some(tag) = tag_in(id) else {
        return Ok(Holder::Here);
    };
    if tag == fleet.tag() {
        return Ok(Holder::Here);
    }
    match fleet.peer(kernel, Wanted::Tagged(tag)).await {
        Ok(Some(peer)) => Ok(Holder::There(peer)),
        Ok(None) => Ok(Holder::Here),
        Err(err) => Err(ApiError::from_kernel(&err)),
    }
}

/// The node tag a fleet's sandbox id ends with, if it is one.
fn tag_in(id: &str) -> Option<&str> {
    if id.len() != SANDBOX_ID_LEN + TAG_LEN || !id.is_ascii() {
        return None;
    }
    id.get(SANDBOX_ID_LEN..)
}

#[cfg(test)]
mod tests {
    use agentos_http::fleet::tag_of;

    use super::*;

    #[test]
    fn ids_carry_their_nodes_tag() {
        let tag = tag_of("node-1.eu_west");
        let id = crate::ids::new_sandbox_id(Some(&tag)).unwrap();
        assert_eq!(id.len(), SANDBOX_ID_LEN + TAG_LEN);
        assert_eq!(tag_in(&id), Some(tag.as_str()));
        assert_eq!(tag_in(&"a".repeat(SANDBOX_ID_LEN)), None);
        // 26 bytes, but not 26 letters: no tag, and no panic.
        let multibyte = format!("{}é{}", "a".repeat(19), "a".repeat(5));
        assert_eq!(multibyte.len(), SANDBOX_ID_LEN + TAG_LEN);
        assert_eq!(tag_in(&multibyte), None);
    }
}
