//! A face in a fleet (docs/fleet.md, "Sandboxes through any node"): a
//! request for what another node holds is forwarded to that node's face
//! ([`crate::forward`]).
//!
//! A forward is proven by the fleet's secret: the forwarding face signs
//! its kind (a forward goes from a face to a face of its kind), the time,
//! its node, the node it is for, the method, the target and what the
//! request is for (a sandbox, a session) with HMAC-SHA256, and
//! the face receiving it checks the signature and the time before it
//! believes the request came from a node. A request that says it is a
//! forward and cannot prove it is refused; one that can is answered where
//! it lands, never forwarded again. The answer proves itself too (an HMAC
//! of the request's signature), so whatever else listens at a node's
//! address gets nothing back to the client. The client's own credentials
//! still prove it, as on one node.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentos_proto::payload::{FleetOp, FleetRequest, NodeInfo, NodesReply};
use agentos_proto::Opcode;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderValue, Method};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::kernel_link::{KernelError, KernelLink, Wait};
use crate::random;
use crate::token::{Token, TokenError};

/// Where the fleet's secret may be given instead of a file.
pub const FLEET_SECRET_ENV: &str = "AGENTOS_FLEET_SECRET";
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

/// The fleet's other nodes, as last asked.
#[derive(Debug, Default)]
struct Nodes {
    peers: Vec<Peer>,
    /// When the kernel last told them.
    told: Option<Instant>,
    /// When it was last asked.
    asked: Option<Instant>,
}

/// The kinds of face that forward: each forwards to its own kind on the
/// other nodes, at the address they advertise for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaceKind {
    /// `agentos e2b`, at `[fleet] advertise`.
    E2b,
    /// `agentos mcp --http`, at `[fleet] advertise_mcp`.
    Mcp,
}

impl FaceKind {
    /// Its name, as its log says it (`agentos NAME: ...`).
    pub fn name(self) -> &'static str {
        match self {
            FaceKind::E2b => "e2b",
            FaceKind::Mcp => "mcp",
        }
    }

    /// Where `node` says this kind of face of its is reached.
    fn address(self, node: &NodeInfo) -> Option<String> {
        match self {
            FaceKind::E2b => node.advertise.clone(),
            FaceKind::Mcp => node.advertise_mcp.clone(),
        }
    }
}

/// This face's part in its node's fleet.
#[derive(Debug)]
pub struct FleetFace {
    face: FaceKind,
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

/// Which node a request is for.
#[derive(Debug, Clone, Copy)]
pub enum Wanted<'a> {
    /// The node of this tag (a sandbox id's end).
    Tagged(&'a str),
    /// The node of this name.
    Named(&'a str),
}

/// Why a request that says it is a forward is not believed.
#[derive(Debug, thiserror::Error)]
#[error("a forward between the fleet's nodes that is not proven: {0}")]
pub struct Unproven(String);

/// A node name that cannot be sent in a header.
#[derive(Debug, thiserror::Error)]
#[error("node name {0:?} cannot be sent in a header")]
pub struct BadNodeName(String);

impl FleetFace {
    /// Face `face` of node `node`, proving its forwards with `secret`.
    pub fn new(face: FaceKind, node: String, secret: Token) -> FleetFace {
        FleetFace {
            face,
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

    /// Another node of the fleet, as `wanted` names it; `None` for this
    /// node or one not known. The fleet's nodes are asked of the kernel
    /// when the one wanted is none known or what was told is old; what
    /// was told stands while the kernel cannot answer.
    pub async fn peer(
        &self,
        kernel: &KernelLink,
        wanted: Wanted<'_>,
    ) -> Result<Option<Peer>, KernelError> {
        let ask = {
            let nodes = self.nodes();
            let stale = self.find(&nodes, wanted).is_none()
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
                    let peers: Vec<Peer> = (reply.nodes.iter())
                        .filter(|node| node.name != self.node)
                        .map(|node| Peer {
                            name: node.name.clone(),
                            advertise: self.face.address(node),
                            alive: node.alive,
                        })
                        .collect();
                    self.log_shared_tags(&peers);
                    let mut nodes = self.nodes();
                    nodes.peers = peers;
                    nodes.told = Some(Instant::now());
                }
                Err(err) if self.find(&self.nodes(), wanted).is_none() => return Err(err),
                Err(_) => {}
            }
        }
        Ok(self.find(&self.nodes(), wanted))
    }

    /// The peer `wanted` among `nodes`. Two nodes of one tag are neither
    /// found by it, as neither can be told from the other.
    fn find(&self, nodes: &Nodes, wanted: Wanted<'_>) -> Option<Peer> {
        let mut found = nodes.peers.iter().filter(|peer| match wanted {
            Wanted::Tagged(tag) => tag_of(&peer.name) == tag,
            Wanted::Named(name) => peer.name == name,
        });
        match (found.next(), found.next()) {
            (Some(peer), None) => Some(peer.clone()),
            _ => None,
        }
    }

    /// Says, once per listing, which nodes share a tag (their sandboxes
    /// are forwarded to neither).
    fn log_shared_tags(&self, peers: &[Peer]) {
        let mut seen: HashMap<String, &str> = HashMap::new();
        for peer in peers {
            if let Some(other) = seen.insert(tag_of(&peer.name), &peer.name) {
                eprintln!(
                    "agentos {}: nodes {other} and {} share a tag: neither is forwarded to",
                    self.face.name(),
                    peer.name
                );
            }
        }
    }

    /// What was told of the fleet's nodes is asked again at the next
    /// lookup (a forward failed).
    pub fn forget_peers(&self) {
        self.nodes().told = None;
    }

    /// The headers that prove a forward of `method` `target` for
    /// `subject` (a sandbox, a session), to node `to`, comes from this
    /// node; and the signature, which the answer proves itself by.
    pub fn sign(
        &self,
        to: &str,
        method: &Method,
        target: &str,
        subject: &str,
    ) -> Result<Signed, BadNodeName> {
        let now = unix_now();
        let signature = self.signature(now, &self.node, to, method, target, subject);
        let value = format!("t={now},v1={}", random::hex(&signature));
        let header =
            |text: &str| HeaderValue::from_str(text).map_err(|_| BadNodeName(self.node.clone()));
        Ok(Signed {
            headers: [
                (FORWARDED_BY, header(&self.node)?),
                (FORWARD_SIGNATURE, header(&value)?),
            ],
            signature: value,
        })
    }

    /// Whether `headers` say the request (`method` `target` for
    /// `subject`) is a node's forward — its signature only when they prove
    /// it; a claim they cannot prove is refused.
    pub fn proven_forward(
        &self,
        headers: &HeaderMap,
        method: &Method,
        target: &str,
        subject: &str,
    ) -> Result<Option<String>, Unproven> {
        let (by, signed) = (one(headers, FORWARDED_BY), one(headers, FORWARD_SIGNATURE));
        if by.is_none() && signed.is_none() {
            return Ok(None);
        }
        let forged = |why: &str| Err(Unproven(why.to_owned()));
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
        let expected = self.signature(time, by, &self.node, method, target, subject);
        if !bool::from(expected.ct_eq(&presented)) {
            return forged("its signature is not the fleet's, for this node");
        }
        Ok(Some(signed.to_owned()))
    }

    /// The proof an answer to the forward signed `signature` carries: that
    /// node `by` (the one answering) holds the fleet's secret.
    fn answer_proof(&self, by: &str, signature: &str) -> String {
        let mut mac = self.mac();
        for part in ["answer", self.face.name(), by, signature] {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        random::hex(&mac.finalize().into_bytes())
    }

    /// Adds to an answer to the forward signed `signature` the proof
    /// that this node answered it.
    pub fn prove_answer(&self, headers: &mut HeaderMap, signature: &str) {
        let proof = self.answer_proof(&self.node, signature);
        if let Ok(proof) = HeaderValue::from_str(&proof) {
            headers.insert(FORWARD_ANSWER, proof);
        }
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

    /// The face's name, for its log.
    pub fn face_name(&self) -> &'static str {
        self.face.name()
    }

    fn signature(
        &self,
        time: u64,
        by: &str,
        to: &str,
        method: &Method,
        target: &str,
        subject: &str,
    ) -> Vec<u8> {
        let mut mac = self.mac();
        let time = time.to_string();
        let kind = self.face.name();
        for part in [kind, &time, by, to, method.as_str(), target, subject] {
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

/// Why a face cannot take its part in a fleet.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(
        "a fleet secret was given, but the kernel at {socket} is in no fleet (it has no \
         [fleet]): there is no node to forward for"
    )]
    NoFleet { socket: String },
}

/// The fleet's secret a face was given: `secret_file`'s (mode 600), else
/// `$AGENTOS_FLEET_SECRET`, else none.
pub fn secret(secret_file: Option<&Path>) -> Result<Option<Token>, TokenError> {
    match (secret_file, std::env::var_os(FLEET_SECRET_ENV)) {
        (Some(path), _) => Token::from_file(path, "--fleet-secret-file").map(Some),
        (None, Some(value)) => Token::new(value.into_encoded_bytes(), FLEET_SECRET_ENV).map(Some),
        (None, None) => Ok(None),
    }
}

/// Face `face`'s part in its kernel's fleet: when the kernel (at
/// `socket`) is node `node` of one, as its HELLO says, and the face has
/// the fleet's `secret` ([`secret`]). A secret without a fleet is an
/// error; a fleet without a secret, a face that forwards nothing.
pub fn join(
    face: FaceKind,
    node: Option<&str>,
    secret: Option<Token>,
    socket: &Path,
) -> Result<Option<FleetFace>, JoinError> {
    match (node, secret) {
        (Some(node), Some(secret)) => Ok(Some(FleetFace::new(face, node.to_owned(), secret))),
        (Some(node), None) => {
            eprintln!(
                "agentos {}: the kernel is node {node} of a fleet, but the face has no fleet \
                 secret (--fleet-secret-file, ${FLEET_SECRET_ENV}): it answers for this node \
                 only and forwards nothing",
                face.name()
            );
            Ok(None)
        }
        (None, Some(_)) => Err(JoinError::NoFleet {
            socket: socket.display().to_string(),
        }),
        (None, None) => Ok(None),
    }
}

/// A request's target, as a forward's signature covers it.
pub fn target_of(uri: &http::Uri) -> &str {
    uri.path_and_query().map_or("/", |target| target.as_str())
}

/// Whether a request is a proven forward (its signature), at a face in a
/// fleet or not: a claim to be one is refused at a face with no fleet
/// secret, which can prove nothing.
pub fn proven_forward(
    fleet: Option<&FleetFace>,
    headers: &HeaderMap,
    method: &Method,
    target: &str,
    subject: &str,
) -> Result<Option<String>, Unproven> {
    match fleet {
        Some(fleet) => fleet.proven_forward(headers, method, target, subject),
        None if headers.contains_key(FORWARDED_BY) || headers.contains_key(FORWARD_SIGNATURE) => {
            Err(Unproven(
                "it reaches a face that has no fleet secret".into(),
            ))
        }
        None => Ok(None),
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
        FleetFace::new(
            FaceKind::E2b,
            node.into(),
            Token::new(secret.into(), "test").unwrap(),
        )
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
            assert!(n2
                .proven_forward(&headers, method, target, sandbox)
                .is_err());
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
    fn a_forward_or_an_answer_of_one_kind_of_face_proves_nothing_to_another() {
        let mcp = |node: &str| {
            let secret = Token::new(SECRET.into(), "test").unwrap();
            FleetFace::new(FaceKind::Mcp, node.into(), secret)
        };
        let post = Method::POST;
        // An E2B face's forward is no MCP face's.
        let (headers, signature) = signed(&face("n1", SECRET), "n2", &post, TARGET);
        assert!(mcp("n2")
            .proven_forward(&headers, &post, TARGET, "x")
            .is_err());
        // Nor is an MCP face's answer to a greeting proof for an E2B face:
        // a face down, another kind of face of its node cannot answer for it.
        let mut answer = HeaderMap::new();
        mcp("n2").prove_answer(&mut answer, &signature);
        assert!(!face("n1", SECRET).is_proven_answer(&answer, "n2", &signature));
        assert!(mcp("n1").is_proven_answer(&answer, "n2", &signature));
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
        assert!(refused.unwrap_err().to_string().contains("30 s"));
    }

    #[test]
    fn tags_are_six_base_36_digits_of_the_name() {
        let tag = tag_of("node-1.eu_west");
        assert_eq!(tag.len(), TAG_LEN);
        assert!(tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(tag, tag_of("node-2.eu_west"));
    }

    #[test]
    fn a_peer_is_found_by_its_name_or_its_tag_unless_two_share_the_tag() {
        let n1 = face("n1", SECRET);
        let peer = |name: &str| Peer {
            name: name.into(),
            advertise: None,
            alive: true,
        };
        let nodes = Nodes {
            peers: vec![peer("n2"), peer("n3")],
            ..Nodes::default()
        };
        assert_eq!(n1.find(&nodes, Wanted::Named("n3")), Some(peer("n3")));
        let tag = tag_of("n2");
        assert_eq!(n1.find(&nodes, Wanted::Tagged(&tag)), Some(peer("n2")));
        assert_eq!(n1.find(&nodes, Wanted::Named("n4")), None);
        let twins = Nodes {
            peers: vec![peer("n2"), peer("n2")],
            ..Nodes::default()
        };
        assert_eq!(n1.find(&twins, Wanted::Tagged(&tag)), None);
    }
}
