//! The face in a fleet (docs/fleet.md, "Sandboxes through any node"): a
//! sandbox's id ends with its node's tag, and a request for a sandbox of
//! another node is forwarded to that node's face ([`crate::forward`]).
//!
//! A forward is proven by the fleet's secret: the forwarding face signs
//! the time, its node, the node it is for, the method, the target and the
//! sandbox with HMAC-SHA256, and the face receiving it checks the
//! signature and the time before it believes the request came from a
//! node. A request that says it is a forward and cannot prove it is
//! refused; one that can is answered where it lands, never forwarded
//! again. The answer proves itself too (an HMAC of the request's
//! signature), so whatever else listens at a node's address gets nothing
//! back to the client. The client's API key or access token still proves
//! the tenant, as on one node.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentos_http::kernel_link::{KernelLink, Wait};
use agentos_http::token::Token;
use agentos_proto::payload::{FleetOp, FleetRequest, NodesReply};
use agentos_proto::Opcode;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::answer::ApiError;
use crate::ids::SANDBOX_ID_LEN;
use crate::random;

/// The header naming the node that forwarded a request.
pub const FORWARDED_BY: &str = "x-agentos-forwarded-by";
/// The header proving it: `t=UNIX_SECONDS,v1=HEX`.
pub const FORWARD_SIGNATURE: &str = "x-agentos-forward-signature";
/// The header of the answer to a forward proving the node that answered.
pub const FORWARD_ANSWER: &str = "x-agentos-forward-answer";
/// What a face asks first on a connection to another node's face, with a
/// nonce, to learn that the face answering is that node's.
pub const GREETING_PATH: &str = "/.agentos/fleet-greeting";
/// Characters of a node's tag at the end of its sandboxes' ids.
pub const TAG_LEN: usize = 6;
/// How far a forward's time may be from this node's.
const MAX_SKEW_SECS: u64 = 30;
/// The fleet's nodes are asked of the kernel at most this often.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// What the kernel said of the fleet's nodes is asked again once this old:
/// a node's address or liveness may have changed.
const PEERS_FRESH: Duration = Duration::from_secs(5);

/// Another node of the fleet, as the face reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    /// Its face's address (`http://HOST:PORT`), if it advertises one.
    pub advertise: Option<String>,
    /// Whether its lease was current when last asked.
    pub alive: bool,
}

/// The fleet's nodes by tag, as last asked.
#[derive(Debug, Default)]
struct Nodes {
    by_tag: HashMap<String, Peer>,
    /// When the kernel last told them.
    told: Option<Instant>,
    /// When it was last asked.
    asked: Option<Instant>,
}

/// This face's part in its node's fleet.
#[derive(Debug)]
pub struct FleetFace {
    node: String,
    tag: String,
    secret: Token,
    nodes: Mutex<Nodes>,
}

/// A forward's proof: its headers, and the signature its answer proves
/// itself by.
#[derive(Debug)]
pub struct Signed {
    pub headers: [(&'static str, HeaderValue); 2],
    pub signature: String,
}

/// Where a request for a sandbox is answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Holder {
    /// Here: its id names this node, or no node known.
    Here,
    /// By another node's face.
    There(Peer),
}

impl FleetFace {
    /// The face of node `node`, proving its forwards with `secret`.
    pub fn new(node: String, secret: Token) -> FleetFace {
        FleetFace {
            tag: tag_of(&node),
            node,
            secret,
            nodes: Mutex::default(),
        }
    }

    /// The tag this node's sandbox ids end with.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Where the sandbox `id` is held, by its id's tag. The fleet's nodes
    /// are asked of the kernel when the tag is none known or what was
    /// told is old; what was told stands while the kernel cannot answer.
    pub async fn holder(&self, kernel: &KernelLink, id: &str) -> Result<Holder, ApiError> {
        let Some(tag) = tag_in(id) else {
            return Ok(Holder::Here);
        };
        if tag == self.tag {
            return Ok(Holder::Here);
        }
        let ask = {
            let nodes = self.nodes();
            let stale = !nodes.by_tag.contains_key(tag)
                || nodes.told.is_none_or(|at| at.elapsed() >= PEERS_FRESH);
            stale && nodes.asked.is_none_or(|at| at.elapsed() >= REFRESH_EVERY)
        };
        if ask {
            self.nodes().asked = Some(Instant::now());
            let request = FleetRequest {
                op: FleetOp::Nodes,
                node: None,
            };
            let told: Result<NodesReply, _> =
                kernel.request(Opcode::FLEET, &request, Wait::Quick).await;
            match told {
                Ok(reply) => {
                    let mut nodes = self.nodes();
                    nodes.by_tag = peers_by_tag(&reply, &self.node);
                    nodes.told = Some(Instant::now());
                }
                Err(err) if !self.nodes().by_tag.contains_key(tag) => {
                    return Err(ApiError::from_kernel(&err));
                }
                Err(_) => {}
            }
        }
        Ok(match self.nodes().by_tag.get(tag) {
            Some(peer) => Holder::There(peer.clone()),
            None => Holder::Here,
        })
    }

    /// What was told of the fleet's nodes is asked again at the next
    /// lookup (a forward failed).
    pub fn forget_peers(&self) {
        self.nodes().told = None;
    }

    /// The headers that prove a forward of `method` `target` for
    /// `sandbox`, to node `to`, comes from this node; and the signature,
    /// which the answer proves itself by.
    pub fn sign(
        &self,
        to: &str,
        method: &Method,
        target: &str,
        sandbox: &str,
    ) -> Result<Signed, ApiError> {
        let now = unix_now();
        let signature = self.signature(now, &self.node, to, method, target, sandbox);
        let value = format!("t={now},v1={}", random::hex(&signature));
        let header = |text: &str| {
            HeaderValue::from_str(text)
                .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "a bad node name"))
        };
        Ok(Signed {
            headers: [
                (FORWARDED_BY, header(&self.node)?),
                (FORWARD_SIGNATURE, header(&value)?),
            ],
            signature: value,
        })
    }

    /// Whether `headers` say the request is a node's forward — its
    /// signature only when they prove it; a claim they cannot prove is
    /// refused.
    pub fn proven_forward(
        &self,
        headers: &HeaderMap,
        method: &Method,
        target: &str,
        sandbox: &str,
    ) -> Result<Option<String>, ApiError> {
        let (by, signed) = (one(headers, FORWARDED_BY), one(headers, FORWARD_SIGNATURE));
        if by.is_none() && signed.is_none() {
            return Ok(None);
        }
        let forged = |why: &str| {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("a forward between the fleet's nodes that is not proven: {why}"),
            ))
        };
        let (Some(by), Some(signed)) = (by, signed) else {
            return forged("it needs both X-AgentOS-Forwarded-By and X-AgentOS-Forward-Signature");
        };
        if by == self.node {
            return forged("it says it comes from this node");
        }
        let Some((time, presented)) = parse_signature(signed) else {
            return forged("its signature is not t=SECONDS,v1=HEX");
        };
        if unix_now().abs_diff(time) > MAX_SKEW_SECS {
            return forged("its time is more than 30 s from this node's");
        }
        let expected = self.signature(time, by, &self.node, method, target, sandbox);
        if !bool::from(expected.ct_eq(&presented)) {
            return forged("its signature is not the fleet's, for this node");
        }
        Ok(Some(signed.to_owned()))
    }

    /// The proof an answer to the forward signed `signature` carries: that
    /// node `by` (the one answering) holds the fleet's secret.
    pub fn answer_proof(&self, by: &str, signature: &str) -> String {
        let mut mac = self.mac();
        for part in ["answer", by, signature] {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        random::hex(&mac.finalize().into_bytes())
    }

    /// Whether `headers`, of node `by`'s answer to the forward signed
    /// `signature`, prove it.
    pub fn is_proven_answer(&self, headers: &HeaderMap, by: &str, signature: &str) -> bool {
        let expected = self.answer_proof(by, signature);
        one(headers, FORWARD_ANSWER)
            .is_some_and(|presented| bool::from(expected.as_bytes().ct_eq(presented.as_bytes())))
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn signature(
        &self,
        time: u64,
        by: &str,
        to: &str,
        method: &Method,
        target: &str,
        sandbox: &str,
    ) -> Vec<u8> {
        let mut mac = self.mac();
        for part in [&time.to_string(), by, to, method.as_str(), target, sandbox] {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        mac.finalize().into_bytes().to_vec()
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(self.secret.as_bytes())
            .expect("HMAC takes a key of any length")
    }

    fn nodes(&self) -> MutexGuard<'_, Nodes> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The tag of node `name`: six base-36 digits of its name's SHA-256.
pub fn tag_of(name: &str) -> String {
    const DIGITS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let hash = Sha256::digest(name.as_bytes());
    let mut number = u64::from_be_bytes(hash[..8].try_into().unwrap_or_default());
    (0..TAG_LEN)
        .map(|_| {
            let digit = DIGITS[(number % 36) as usize];
            number /= 36;
            char::from(digit)
        })
        .collect()
}

/// The node tag a fleet's sandbox id ends with, if it is one.
fn tag_in(id: &str) -> Option<&str> {
    if id.len() != SANDBOX_ID_LEN + TAG_LEN || !id.is_ascii() {
        return None;
    }
    id.get(SANDBOX_ID_LEN..)
}

/// The other nodes in `reply`, by tag; two nodes of one tag are left out,
/// as neither can be told from the other.
fn peers_by_tag(reply: &NodesReply, me: &str) -> HashMap<String, Peer> {
    let mut by_tag: HashMap<String, Option<Peer>> = HashMap::new();
    for node in reply.nodes.iter().filter(|node| node.name != me) {
        let peer = Peer {
            name: node.name.clone(),
            advertise: node.advertise.clone(),
            alive: node.alive,
        };
        by_tag
            .entry(tag_of(&node.name))
            .and_modify(|seen| {
                if let Some(other) = seen.take() {
                    eprintln!(
                        "agentos e2b: nodes {} and {} share a tag: neither is forwarded to",
                        other.name, peer.name
                    );
                }
            })
            .or_insert(Some(peer.clone()));
    }
    (by_tag.into_iter())
        .filter_map(|(tag, peer)| Some((tag, peer?)))
        .collect()
}

fn parse_signature(value: &str) -> Option<(u64, Vec<u8>)> {
    let (time, hex) = value.strip_prefix("t=")?.split_once(",v1=")?;
    let time = time.parse().ok()?;
    if hex.len() != 64 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(hex.get(at..at + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((time, bytes))
}

fn one<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok(),
        // Two are as good as a bad one: a forward has one.
        (Some(_), Some(_)) => Some(""),
        (None, _) => None,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn face(node: &str, secret: &str) -> FleetFace {
        FleetFace::new(node.into(), Token::new(secret.into(), "test").unwrap())
    }

    /// `by`'s forward to `to`, and its signature.
    fn signed(by: &FleetFace, to: &str, method: &Method, target: &str) -> (HeaderMap, String) {
        let mut headers = HeaderMap::new();
        let signed = by.sign(to, method, target, "x").unwrap();
        for (name, value) in signed.headers {
            headers.insert(name, value);
        }
        (headers, signed.signature)
    }

    const SECRET: &str = "a-fleet-secret-of-enough-length-0123456789";
    const TARGET: &str = "/sandboxes/x/timeout";

    #[test]
    fn a_forward_signed_with_the_fleets_secret_for_this_node_is_proven_and_nothing_else_is() {
        let (n1, n2, n3) = (face("n1", SECRET), face("n2", SECRET), face("n3", SECRET));
        let post = Method::POST;
        let (headers, signature) = signed(&n1, "n2", &post, TARGET);
        let proven = n2.proven_forward(&headers, &post, TARGET, "x").unwrap();
        assert_eq!(proven.as_deref(), Some(signature.as_str()));
        // Not for another target, sandbox, method or node.
        for (method, target, sandbox) in [
            (&post, "/sandboxes/y/timeout", "x"),
            (&post, TARGET, "y"),
            (&Method::DELETE, TARGET, "x"),
        ] {
            let refused = n2.proven_forward(&headers, method, target, sandbox);
            assert_eq!(refused.unwrap_err().status, StatusCode::FORBIDDEN);
        }
        assert!(
            n3.proven_forward(&headers, &post, TARGET, "x").is_err(),
            "replayed elsewhere"
        );
        // Not with another secret, nor claiming to be the node itself.
        let stranger = face("n1", "another-secret-of-enough-length-0123456789");
        let (forged, _) = signed(&stranger, "n2", &post, TARGET);
        assert!(n2.proven_forward(&forged, &post, TARGET, "x").is_err());
        let (own_name, _) = signed(&face("n2", SECRET), "n2", &post, TARGET);
        assert!(n2.proven_forward(&own_name, &post, TARGET, "x").is_err());
        // A claim without a signature is refused; no claim is no forward.
        let mut bare = HeaderMap::new();
        bare.insert(FORWARDED_BY, HeaderValue::from_static("n1"));
        assert!(n2.proven_forward(&bare, &post, "/", "x").is_err());
        assert_eq!(
            n2.proven_forward(&HeaderMap::new(), &post, "/", "x")
                .unwrap(),
            None
        );
    }

    #[test]
    fn an_answer_is_proven_only_by_the_node_it_was_for() {
        let (n1, n2) = (face("n1", SECRET), face("n2", SECRET));
        let (_, signature) = signed(&n1, "n2", &Method::GET, TARGET);
        let mut answer = HeaderMap::new();
        let proof = n2.answer_proof("n2", &signature);
        answer.insert(FORWARD_ANSWER, HeaderValue::from_str(&proof).unwrap());
        assert!(n1.is_proven_answer(&answer, "n2", &signature));
        assert!(!n1.is_proven_answer(&answer, "n3", &signature));
        assert!(!n1.is_proven_answer(&HeaderMap::new(), "n2", &signature));
        let stranger = face("n2", "another-secret-of-enough-length-0123456789");
        let mut forged = HeaderMap::new();
        let proof = stranger.answer_proof("n2", &signature);
        forged.insert(FORWARD_ANSWER, HeaderValue::from_str(&proof).unwrap());
        assert!(!n1.is_proven_answer(&forged, "n2", &signature));
    }

    #[test]
    fn an_old_forward_is_refused() {
        let n2 = face("n2", SECRET);
        let old = unix_now() - 120;
        let signature = n2.signature(old, "n1", "n2", &Method::GET, "/health", "x");
        let mut headers = HeaderMap::new();
        headers.insert(FORWARDED_BY, HeaderValue::from_static("n1"));
        let value = format!("t={old},v1={}", random::hex(&signature));
        headers.insert(FORWARD_SIGNATURE, HeaderValue::from_str(&value).unwrap());
        let refused = n2.proven_forward(&headers, &Method::GET, "/health", "x");
        assert!(refused.unwrap_err().message.contains("30 s"));
    }

    #[test]
    fn tags_are_six_id_characters_and_ids_carry_them() {
        let tag = tag_of("node-1.eu_west");
        assert_eq!(tag.len(), TAG_LEN);
        assert!(tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(tag, tag_of("node-2.eu_west"));
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
