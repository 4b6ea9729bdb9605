//! `POST /v2/sandboxes`: a sandbox is a session the key's delegate opens,
//! from a template, with its environment, labels, lifetime, network and
//! limits. A field the face cannot honour is refused by name, never
//! dropped.

use std::collections::BTreeMap;
use std::time::Instant;

use agentos_http::Body;
use agentos_proto::payload::{
    DelegateName, ExecRequest, Lifetime, LifetimeEnd, Network, NetworkPolicy, SessionOpen,
    SessionSetup, MAX_LIFETIME_MS,
};
use http::{HeaderMap, Response, StatusCode};
use serde::de::IgnoredAny;
use serde::Deserialize;

use super::context::Control;
use super::shapes::{Lifecycle, ListedSandbox, SandboxAccess};
use crate::answer::{json, ApiError};
use crate::face::Face;
use crate::idempotency::{Claim, Outcome};
use crate::ids::new_sandbox_id;
use crate::tenant::{
    IDEMPOTENCY_LABEL, ON_TIMEOUT_LABEL, OWN_LABEL_PREFIX, STARTED_LABEL, TEMPLATE_LABEL,
};
use agentos_http::fleet::FleetFace;

/// A sandbox's lifetime when create or connect names none (E2B's).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// The body of a create, as the SDKs send it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default, rename = "envVars")]
    env_vars: BTreeMap<String, String>,
    allow_internet_access: Option<bool>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    #[serde(rename = "autoPauseMemory")]
    auto_pause_memory: Option<bool>,
    #[serde(rename = "autoResume")]
    auto_resume: Option<AutoResume>,
    network: Option<NetworkConfig>,
    #[serde(rename = "volumeMounts")]
    volume_mounts: Option<Vec<IgnoredAny>>,
    iam: Option<IgnoredAny>,
    mcp: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AutoResume {
    enabled: bool,
}

/// `network`: what the sandbox may reach.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkConfig {
    #[serde(default, rename = "allowOut")]
    allow_out: Vec<String>,
    #[serde(default, rename = "denyOut")]
    deny_out: Vec<String>,
    rules: Option<IgnoredAny>,
    #[serde(rename = "egressProxy")]
    egress_proxy: Option<IgnoredAny>,
    #[serde(rename = "dnsServers")]
    dns_servers: Option<IgnoredAny>,
    #[serde(rename = "allowPublicTraffic")]
    allow_public_traffic: Option<bool>,
    #[serde(rename = "maskRequestHost")]
    mask_request_host: Option<IgnoredAny>,
    #[serde(rename = "httpsPorts")]
    https_ports: Option<IgnoredAny>,
}

/// Every address, in E2B's words.
const ALL_ADDRESSES: &str = "0.0.0.0/0";

impl NewSandbox {
    /// The body of a create, or why not: an unknown field is named.
    pub fn parse(body: &[u8]) -> Result<NewSandbox, ApiError> {
        serde_json::from_slice(body)
            .map_err(|err| ApiError::bad_request(format!("the request body: {err}")))
    }

    /// A field given that the face does not honour, by name.
    fn refused_field(&self) -> Option<&'static str> {
        let network = self.network.as_ref();
        let given = [
            ("iam", self.iam.is_some()),
            ("mcp", self.mcp.is_some()),
            (
                "volumeMounts",
                self.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()),
            ),
            (
                "autoResume",
                self.auto_resume.as_ref().is_some_and(|a| a.enabled),
            ),
            ("autoPauseMemory", self.auto_pause_memory == Some(true)),
            ("network.rules", network.is_some_and(|n| n.rules.is_some())),
            (
                "network.egressProxy",
                network.is_some_and(|n| n.egress_proxy.is_some()),
            ),
            (
                "network.dnsServers",
                network.is_some_and(|n| n.dns_servers.is_some()),
            ),
            (
                "network.allowPublicTraffic",
                network.is_some_and(|n| n.allow_public_traffic == Some(true)),
            ),
            (
                "network.maskRequestHost",
                network.is_some_and(|n| n.mask_request_host.is_some()),
            ),
            (
                "network.httpsPorts",
                network.is_some_and(|n| n.https_ports.is_some()),
            ),
        ];
        given
            .into_iter()
            .find_map(|(name, given)| given.then_some(name))
    }
}

/// What the sandbox may reach. E2B's sandboxes reach the internet unless
/// told not to; here the kernel's default (left out) stands for that, so
/// the operator's policy decides. As in E2B, `allowOut` wins over
/// `denyOut`: everything denied (`false`, or `denyOut` 0.0.0.0/0) leaves
/// loopback only, or `allowOut` alone.
fn network_of(
    allow_internet_access: Option<bool>,
    config: Option<&NetworkConfig>,
) -> Result<Option<Network>, ApiError> {
    let empty = NetworkConfig::default();
    let config = config.unwrap_or(&empty);
    let everything = |list: &[String]| list.iter().any(|entry| entry == ALL_ADDRESSES);
    if everything(&config.allow_out) {
        return Ok(None);
    }
    let (allow, deny) = (config.allow_out.clone(), config.deny_out.clone());
    let policy = |allow, deny| Network::Policy(Box::new(NetworkPolicy { allow, deny }));
    if allow_internet_access == Some(false) || everything(&deny) {
        if allow.is_empty() {
            return Ok(Some(Network::Host(false)));
        }
        return Ok(Some(policy(allow, Vec::new())));
    }
    if deny.is_empty() {
        // The internet is on: what allowOut names is reached already.
        return Ok(None);
    }
    if !allow.is_empty() {
        return Err(ApiError::bad_request(
            "network.allowOut is taken only with everything else denied (denyOut 0.0.0.0/0 or \
             allow_internet_access false); as exceptions within other denied ranges it is not \
             supported by agentos e2b",
        ));
    }
    Ok(Some(policy(vec!["*".to_owned()], deny)))
}

/// The kernel's template for E2B's name: `base` is the plain sandbox and
/// `code-interpreter-v1` is `python-data`; other names are the kernel's.
pub fn kernel_template(template_id: &str) -> Option<String> {
    match template_id {
        "base" => None,
        "code-interpreter-v1" => Some("python-data".to_owned()),
        other => Some(other.to_owned()),
    }
}

/// A sandbox's lifetime of `seconds` (E2B's `timeout`), ending as asked.
pub fn lifetime_of(seconds: Option<i64>, then: LifetimeEnd) -> Result<Lifetime, ApiError> {
    let seconds = seconds.unwrap_or(DEFAULT_TIMEOUT_SECS as i64);
    let ms = u64::try_from(seconds)
        .ok()
        .and_then(|seconds| seconds.checked_mul(1000))
        .filter(|ms| (1..=MAX_LIFETIME_MS).contains(ms))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "timeout must be 1 to {} seconds (got {seconds})",
                MAX_LIFETIME_MS / 1000
            ))
        })?;
    Ok(Lifetime { ms, then })
}

/// Opens the sandbox `asked` describes, labelled with `idempotency`
/// (the key and the body's hash) if the create carried a key.
pub async fn create(
    cx: &Control<'_>,
    asked: NewSandbox,
    idempotency: Option<String>,
) -> Result<SandboxAccess, ApiError> {
    if let Some(field) = asked.refused_field() {
        return Err(ApiError::bad_request(format!(
            "{field} is not supported by agentos e2b"
        )));
    }
    if let Some(own) = asked
        .metadata
        .keys()
        .find(|name| name.starts_with(OWN_LABEL_PREFIX))
    {
        return Err(ApiError::bad_request(format!(
            "metadata {own:?}: names starting {OWN_LABEL_PREFIX:?} are the face's own"
        )));
    }
    let then = match asked.auto_pause {
        Some(true) => LifetimeEnd::Hibernate,
        _ => LifetimeEnd::Close,
    };
    let lifetime = lifetime_of(asked.timeout, then)?;
    let network = network_of(asked.allow_internet_access, asked.network.as_ref())?;
    let id = new_sandbox_id(cx.face.fleet.as_ref().map(FleetFace::tag))?;
    let mut labels = asked.metadata;
    labels.insert(TEMPLATE_LABEL.to_owned(), asked.template_id.clone());
    let now = chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now());
    let started = now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    labels.insert(STARTED_LABEL.to_owned(), started);
    labels.insert(
        ON_TIMEOUT_LABEL.to_owned(),
        Lifecycle::of(then).on_timeout.to_owned(),
    );
    if let Some(idempotency) = idempotency {
        labels.insert(IDEMPOTENCY_LABEL.to_owned(), idempotency);
    }
    let mut env = asked.env_vars;
    env.insert("E2B_SANDBOX".to_owned(), "true".to_owned());
    env.insert("E2B_SANDBOX_ID".to_owned(), id.clone());
    // The sandbox's one user, by the name E2B's SDKs give it.
    for name in ["USER", "LOGNAME"] {
        env.entry(name.to_owned())
            .or_insert_with(|| "user".to_owned());
    }
    let open = SessionOpen {
        run: ExecRequest {
            session: Some(id.clone()),
            template: kernel_template(&asked.template_id),
            network,
            limits: Some(cx.face.sizing.limits()),
            ..ExecRequest::default()
        },
        setup: SessionSetup {
            env,
            labels: Some(labels),
            lifetime: Some(lifetime),
        },
    };
    let _place = within_quota(cx, &id).await?;
    cx.tenant.open(open).await.map_err(|err| {
        if err.status == StatusCode::NOT_FOUND {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "template '{}' not found: {}",
                    asked.template_id, err.message
                ),
            )
        } else {
            err
        }
    })?;
    Ok(cx.access(id, asked.template_id))
}

/// A create, made once per `Idempotency-Key` if it carries one. A
/// create without one that failed on the kernel's side may still have
/// made the sandbox, so the SDK is told not to send it again.
pub async fn create_once(
    cx: &Control<'_>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let asked = NewSandbox::parse(body)?;
    let claim = match headers.get("idempotency-key") {
        None => None,
        Some(key) => Some(Claim::new(
            key.to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key: not ASCII"))?,
            body,
        )?),
    };
    let Some(claim) = claim else {
        return match create(cx, asked, None).await {
            Ok(access) => Ok(json(StatusCode::CREATED, &access)),
            Err(mut err) => {
                err.no_retry = err.status.is_server_error();
                Err(err)
            }
        };
    };
    let delegate = cx.tenant.delegate;
    let earlier = cx
        .face
        .idempotency()
        .begin(delegate, &claim, Instant::now())?;
    if let Some(Outcome::Made { sandbox, template }) = earlier {
        return Ok(json(StatusCode::CREATED, &cx.access(sandbox, template)));
    }
    let made = match made_before(cx, &claim).await {
        Ok(Some(access)) => Ok(access),
        Ok(None) => create(cx, asked, Some(claim.label())).await,
        Err(err) => Err(err),
    };
    let mut remembered = cx.face.idempotency();
    match made {
        Ok(access) => {
            remembered.made(delegate, &claim, &access.sandbox_id, &access.template_id);
            Ok(json(StatusCode::CREATED, &access))
        }
        Err(err) => {
            remembered.failed(delegate, &claim);
            Err(err)
        }
    }
}

/// The sandbox a create with this claim's key made before the face
/// last started, found by its label.
async fn made_before(cx: &Control<'_>, claim: &Claim) -> Result<Option<SandboxAccess>, ApiError> {
    for session in cx.tenant.sandboxes().await? {
        let Some(earlier) = session
            .labels
            .get(IDEMPOTENCY_LABEL)
            .and_then(|label| Claim::of_label(label))
        else {
            continue;
        };
        if earlier.key == claim.key {
            claim.check_same_body(&earlier)?;
            let template = ListedSandbox::of(&session, cx.face.sizing.sizes()).template_id;
            return Ok(Some(cx.access(session.session, template)));
        }
    }
    Ok(None)
}

/// A place in the tenant's share, held while its sandbox is made or
/// woken: others begun later count it until it is listed live.
pub struct Place<'a> {
    face: &'a Face,
    delegate: DelegateName,
    ticket: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.face.making().end(self.delegate, self.ticket);
    }
}

/// A place for sandbox `id`, one more live sandbox in the tenant's
/// share, or a 429 once it holds the face's share (paused ones with
/// their memory count; hibernated ones do not), those being made
/// counted.
pub async fn within_quota<'a>(cx: &Control<'a>, id: &str) -> Result<Place<'a>, ApiError> {
    use agentos_proto::payload::SessionState;
    let most = cx.face.sizing.max_sandboxes_per_key;
    let delegate = cx.tenant.delegate;
    let (ticket, being_made) = cx.face.making().begin(delegate, id);
    let place = Place {
        face: cx.face,
        delegate,
        ticket,
    };
    let live: Vec<String> = (cx.tenant.sandboxes().await?.into_iter())
        .filter(|session| {
            matches!(
                session.state,
                SessionState::Running | SessionState::Ready | SessionState::Paused
            )
        })
        .map(|session| session.session)
        .collect();
    // Its own id among them is a wake of the same sandbox asked twice.
    let being_made = being_made
        .iter()
        .filter(|made| *made != id && !live.contains(made));
    let live = live.len() + being_made.count();
    if live >= most {
        let mut err = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this key holds {live} live sandboxes, the most agentos e2b gives one key \
                 (--max-sandboxes-per-key {most}); kill or pause one first"
            ),
        );
        err.retry_after = Some(5);
        return Err(err);
    }
    Ok(place)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(allow: &[&str], deny: &[&str]) -> NetworkConfig {
        NetworkConfig {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            ..NetworkConfig::default()
        }
    }

    fn policy(network: Option<Network>) -> (Vec<String>, Vec<String>) {
        match network {
            Some(Network::Policy(policy)) => (policy.allow, policy.deny),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_internet_on_is_the_kernels_default_and_off_is_loopback_or_the_allowed() {
        assert_eq!(network_of(None, None).unwrap(), None);
        assert_eq!(network_of(Some(true), None).unwrap(), None);
        assert_eq!(
            network_of(Some(false), None).unwrap(),
            Some(Network::Host(false))
        );
        let only = config(&["pypi.org", "10.0.0.0/8"], &["0.0.0.0/0"]);
        assert_eq!(
            policy(network_of(None, Some(&only)).unwrap()),
            (vec!["pypi.org".into(), "10.0.0.0/8".into()], vec![])
        );
        let denied = config(&[], &["169.254.0.0/16"]);
        assert_eq!(
            policy(network_of(None, Some(&denied)).unwrap()),
            (vec!["*".into()], vec!["169.254.0.0/16".into()])
        );
        let exceptions = config(&["1.2.3.4"], &["1.0.0.0/8"]);
        assert!(network_of(None, Some(&exceptions)).is_err());
    }

    #[test]
    fn unhonoured_fields_are_named_and_unknown_ones_refused() {
        let asked = NewSandbox::parse(br#"{"templateID":"base","mcp":{"x":1}}"#).unwrap();
        assert_eq!(asked.refused_field(), Some("mcp"));
        let asked = NewSandbox::parse(br#"{"templateID":"base","network":{"rules":{}}}"#).unwrap();
        assert_eq!(asked.refused_field(), Some("network.rules"));
        let asked = NewSandbox::parse(
            br#"{"templateID":"base","volumeMounts":[],"autoResume":{"enabled":false}}"#,
        )
        .unwrap();
        assert_eq!(asked.refused_field(), None);
        let unknown = NewSandbox::parse(br#"{"templateID":"base","gpu":1}"#).unwrap_err();
        assert!(
            unknown.message.contains("unknown field `gpu`"),
            "{unknown:?}"
        );
        assert!(NewSandbox::parse(br#"{"timeout":5}"#).is_err());
    }

    #[test]
    fn a_timeout_is_one_second_to_thirty_days() {
        assert_eq!(lifetime_of(None, LifetimeEnd::Close).unwrap().ms, 300_000);
        for bad in [0, -1, i64::MAX, (MAX_LIFETIME_MS / 1000 + 1) as i64] {
            assert!(lifetime_of(Some(bad), LifetimeEnd::Close).is_err(), "{bad}");
        }
    }
}
