//! The TLS the proxy speaks when it intercepts a host with a credential:
//! a certificate authority minted at start (its key never leaves memory),
//! a leaf per host signed by it, and a client configuration that checks
//! the real server against the public roots, the system's bundle and the
//! configured extra roots.

use std::collections::HashMap;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// How many hosts' leaf configurations are kept; past it the cache is
/// emptied and refilled (credential hosts are few).
const KEPT_LEAVES: usize = 128;

/// Where Debian keeps the system's trusted roots.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Only HTTP/1.1 inside an intercepted tunnel: the proxy rewrites its
/// request heads, and has no HTTP/2 framing to rewrite.
const ALPN: &[u8] = b"http/1.1";

/// Why interception could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// minting a certificate failed: {0}
    #[error("minting a certificate failed: {0}")]
    Mint(#[from] rcgen::Error),
    /// rustls refused a configuration: {0}
    #[error("rustls refused a configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The per-boot certificate authority and the leaves it has signed.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    provider: Arc<CryptoProvider>,
    leaves: HashMap<String, Arc<ServerConfig>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("leaves", &self.leaves.len())
            .finish_non_exhaustive()
    }
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Authority {
    /// Mints a new CA.
    pub fn mint(provider: Arc<CryptoProvider>) -> Result<Authority, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "AgentOS egress proxy (this boot)");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        Ok(Authority {
            ca_der: cert.der().clone(),
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            provider,
            leaves: HashMap::new(),
        })
    }

    pub fn certificate_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server configuration presenting a leaf for `host` (a name or an
    /// address), minted on first use.
    pub fn server_config(&mut self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        if let Some(config) = self.leaves.get(host) {
            return Ok(config.clone());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host);
        params.distinguished_name = name;
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&key, &self.issuer)?;
        let chain = vec![leaf.der().clone(), self.ca_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        let config = Arc::new(config);
        if self.leaves.len() >= KEPT_LEAVES {
            self.leaves.clear();
        }
        self.leaves.insert(host.to_owned(), config.clone());
        Ok(config)
    }
}

/// The configuration the proxy connects to intercepted hosts with: the
/// public roots, the system's, and `extra_roots_pem`.
pub fn upstream_config(
    provider: Arc<CryptoProvider>,
    extra_roots_pem: &[u8],
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots
        .roots
        .extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Ok(system) = std::fs::read(SYSTEM_ROOTS) {
        roots.add_parsable_certificates(
            CertificateDer::pem_slice_iter(&system).filter_map(Result::ok),
        );
    }
    let (added, ignored) = roots.add_parsable_certificates(
        CertificateDer::pem_slice_iter(extra_roots_pem).filter_map(Result::ok),
    );
    if ignored > 0 {
        log::warn!(
            "network: {ignored} of the extra CA certificates could not be used ({added} were)"
        );
    }
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Arc::new(config))
}
