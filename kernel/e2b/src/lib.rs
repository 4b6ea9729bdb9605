//! `agentos e2b`: E2B's sandbox API served over AgentOS, so E2B's own
//! SDKs (with `E2B_API_URL` and `E2B_SANDBOX_URL` set to the face) make,
//! use and end AgentOS sandboxes unmodified.
//!
//! An E2B sandbox is one long-lived session of the kernel's: one set of
//! namespaces and one cgroup, from a template, with a disk, a lifetime,
//! pause and hibernation. Each API key is a delegate principal of the
//! kernel's (`e2b.NAME`), so one key's sandboxes are `not_found` to
//! another's in the kernel itself, and no key gets more than the user
//! running the face.
//!
//! - [`keys`]: the keys, hashed, from a file or the environment;
//! - `tokens`: the envd access tokens a sandbox's requests carry;
//! - `control`: the control API (create, list, get, kill, timeout,
//!   pause, connect);
//! - `sandbox_api`: a sandbox's own API (envd), proven by its token;
//! - `service`: how a request is told apart, proven and answered.

mod answer;
mod context_locks;
mod control;
mod cpu_samples;
mod envd;
mod face;
mod fleet;
mod idempotency;
mod ids;
mod interpreter;
pub mod keys;
mod making;
mod query;
mod sandbox_api;
mod service;
mod signed;
mod tenant;
mod tokens;
mod watchers;

use std::path::PathBuf;
use std::sync::Arc;

use agentos_http::fleet::{FaceKind, JoinError};
use agentos_http::kernel_link::{KernelError, KernelLink, Wait};
use agentos_http::token::{default_token_path, Origin, Token, TokenError};
use agentos_http::{Face as HttpFace, HttpError, HttpOptions, KeyedPlan};
use agentos_proto::payload::{HelloReply, HelloRequest};
use agentos_proto::Opcode;

pub use face::Sizing;
use keys::{Keys, KeysError, KEY_ENV};

/// The face, as `agentos_http` serves it.
const FACE: HttpFace = HttpFace {
    name: "e2b",
    path: "/",
    token_env: KEY_ENV,
    max_body_bytes: 1 << 20,
};

/// How the face is pointed at another kernel socket.
const SOCKET_HINT: &str = "Start agentosd, or give agentos e2b --socket PATH";

/// What `agentos e2b` is given.
#[derive(Debug, Clone)]
pub struct E2bOptions {
    pub listen: String,
    pub socket: PathBuf,
    /// `NAME sha256:HEX` lines; else `AGENTOS_E2B_API_KEY`; else the
    /// default keys file if there is one; else no keys.
    pub keys_file: Option<PathBuf>,
    /// The envd token secret; else one made and kept for the user.
    pub secret_file: Option<PathBuf>,
    pub allow_hosts: Vec<String>,
    pub sizing: Sizing,
    /// The fleet's secret, proving forwards between nodes' faces; else
    /// `AGENTOS_FLEET_SECRET`; else the face forwards nothing.
    pub fleet_secret_file: Option<PathBuf>,
}

/// Why the face does not serve.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error("the access token secret")]
    Secret(#[from] TokenError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(
        "the kernel at {socket} does not keep session disks and processes, which every E2B \
         sandbox needs (/home/user lives on its disk; commands are its processes): run \
         agentosd as root"
    )]
    KernelLacks { socket: String },
    #[error(transparent)]
    Fleet(#[from] JoinError),
    #[error("the fleet's secret")]
    FleetSecret(#[source] TokenError),
}

/// Where `agentos e2b keys add` keeps keys, and where the face looks
/// when given none: `$XDG_CONFIG_HOME/agentos/e2b-keys`.
pub fn default_keys_path() -> Result<PathBuf, TokenError> {
    let token = default_token_path("e2b-keys")?;
    Ok(token.with_file_name("e2b-keys"))
}

/// The keys the face serves with: those given, else its own, made once
/// and kept for its user in `~/.config/agentos/e2b-token`.
fn keys_of(options: &E2bOptions) -> Result<Keys, E2bError> {
    if let Some(path) = &options.keys_file {
        return Ok(Keys::from_file(path)?);
    }
    if let Some(value) = std::env::var_os(KEY_ENV) {
        return Ok(Keys::from_env_value(&value.into_encoded_bytes())?);
    }
    if let Ok(path) = default_keys_path() {
        if path.exists() {
            return Ok(Keys::from_file(&path)?);
        }
    }
    let path = default_token_path("e2b")?;
    let (key, origin) = Token::made_or_kept(&path)?;
    let when = match origin {
        Origin::Made(_) => "made now",
        _ => "made by an earlier start",
    };
    eprintln!(
        "agentos e2b: no keys given (--keys-file, ${KEY_ENV}, `agentos e2b keys add NAME`): \
         every request must carry X-API-KEY set to the content of {} ({when}, readable by you \
         only), on your own connections",
        path.display()
    );
    Ok(Keys::own(key.as_bytes()))
}

/// Serves E2B's API until SIGINT or SIGTERM, on the current runtime.
pub async fn serve(options: E2bOptions) -> Result<(), E2bError> {
    let keys = keys_of(&options)?;
    let http = HttpOptions {
        listen: options.listen.clone(),
        token_file: None,
        allow_origins: Vec::new(),
        allow_hosts: options.allow_hosts.clone(),
    };
    let plan = KeyedPlan::new(FACE, &http, keys.given())?;
    let secret = match &options.secret_file {
        Some(path) => Token::from_file(path, "--secret-file")?,
        None => Token::made_or_kept(&default_token_path("e2b-secret")?)?.0,
    };
    let kernel = KernelLink::new(options.socket.clone(), SOCKET_HINT);
    let hello: HelloReply = kernel
        .request(Opcode::HELLO, &HelloRequest {}, Wait::Quick)
        .await?;
    if !(hello.features.session_disks && hello.features.processes) {
        return Err(E2bError::KernelLacks {
            socket: options.socket.display().to_string(),
        });
    }
    let tokens = tokens::EnvdTokens::new(secret);
    let fleet_secret = agentos_http::fleet::secret(options.fleet_secret_file.as_deref())
        .map_err(E2bError::FleetSecret)?;
    let node = hello.node.as_deref();
    let fleet = agentos_http::fleet::join(FaceKind::E2b, node, fleet_secret, &options.socket)?;
    let serve = |site: &agentos_http::Site| {
        let face = face::Face::new(kernel, keys, tokens, site.clone(), options.sizing, fleet);
        service::E2bService::new(Arc::new(face))
    };
    Ok(agentos_http::serve_keyed(plan, serve).await?)
}
