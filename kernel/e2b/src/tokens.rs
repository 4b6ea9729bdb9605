//! envd access tokens: what a sandbox's requests carry to show whose the
//! sandbox is.
//!
//! `envdAccessToken` is `DELEGATE.MAC`, MAC being
//! base64url(HMAC-SHA256(secret, "envd:DELEGATE:SANDBOX")) with a secret
//! the face keeps (32 random bytes in a file only its user reads).
//! `trafficAccessToken`, which the code interpreter's SDKs send on every
//! request (its `/contexts` calls carry no other), is made the same way
//! from "traffic:DELEGATE:SANDBOX", so neither stands for the other. The
//! face needs no record of tokens: a request's delegate is derived from
//! the token it carries, once the token is verified for the sandbox the
//! request names, so a token shown for another sandbox is refused before
//! any kernel call, and one of another key's speaks for that key only.

use agentos_http::token::Token;
use agentos_proto::payload::DelegateName;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// What a token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `X-Access-Token`: the sandbox's envd, and its code's `/execute`.
    Envd,
    /// `E2B-Traffic-Access-Token`: the code interpreter's requests.
    Traffic,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::Envd => b"envd:",
            Purpose::Traffic => b"traffic:",
        }
    }
}

/// Mints and verifies access tokens with the face's secret.
#[derive(Debug)]
pub struct EnvdTokens {
    secret: Token,
}

impl EnvdTokens {
    pub fn new(secret: Token) -> EnvdTokens {
        EnvdTokens { secret }
    }

    /// The envd token for `delegate`'s sandbox `sandbox`.
    pub fn mint(&self, delegate: DelegateName, sandbox: &str) -> String {
        self.mint_for(Purpose::Envd, delegate, sandbox)
    }

    /// The token for `purpose` of `delegate`'s sandbox `sandbox`.
    pub fn mint_for(&self, purpose: Purpose, delegate: DelegateName, sandbox: &str) -> String {
        let mac = self.mac(purpose, delegate, sandbox).finalize().into_bytes();
        format!("{}.{}", delegate.as_str(), URL_SAFE_NO_PAD.encode(mac))
    }

    /// The delegate `token` was minted for, if it was minted for
    /// `purpose` of `sandbox` with this face's secret.
    pub fn verify_for(&self, purpose: Purpose, token: &str, sandbox: &str) -> Option<DelegateName> {
        let (delegate, mac) = token.rsplit_once('.')?;
        let delegate = DelegateName::new(delegate).ok()?;
        let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
        // verify_slice compares in constant time.
        self.mac(purpose, delegate, sandbox)
            .verify_slice(&mac)
            .ok()?;
        Some(delegate)
    }

    fn mac(&self, purpose: Purpose, delegate: DelegateName, sandbox: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.secret.as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(purpose.label());
        mac.update(delegate.as_str().as_bytes());
        mac.update(b":");
        mac.update(sandbox.as_bytes());
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(secret: &str) -> EnvdTokens {
        EnvdTokens::new(Token::new(secret.as_bytes().to_vec(), "test").unwrap())
    }

    #[test]
    fn a_token_speaks_for_its_delegate_and_its_sandbox_only() {
        let face = tokens("0123456789abcdef0123456789abcdef");
        let alice = DelegateName::new("e2b.alice").unwrap();
        let token = face.mint(alice, "sb1");
        assert!(token.starts_with("e2b.alice."), "{token}");
        assert_eq!(face.verify_for(Purpose::Envd, &token, "sb1"), Some(alice));
        assert_eq!(face.verify_for(Purpose::Envd, &token, "sb2"), None);
        // Another delegate's name in front of alice's MAC.
        let (_, mac) = token.rsplit_once('.').unwrap();
        assert_eq!(
            face.verify_for(Purpose::Envd, &format!("e2b.bob.{mac}"), "sb1"),
            None
        );
        assert_eq!(
            face.verify_for(Purpose::Envd, &format!("{token}x"), "sb1"),
            None
        );
        assert_eq!(face.verify_for(Purpose::Envd, "", "sb1"), None);
        assert_eq!(face.verify_for(Purpose::Envd, "e2b.alice.", "sb1"), None);
        // Another face's secret.
        let other = tokens("fedcba9876543210fedcba9876543210");
        assert_eq!(other.verify_for(Purpose::Envd, &token, "sb1"), None);
        // A traffic token is not an envd token, nor the other way.
        let traffic = face.mint_for(Purpose::Traffic, alice, "sb1");
        assert_ne!(traffic, token);
        assert_eq!(face.verify_for(Purpose::Envd, &traffic, "sb1"), None);
        assert_eq!(
            face.verify_for(Purpose::Traffic, &traffic, "sb1"),
            Some(alice)
        );
        assert_eq!(face.verify_for(Purpose::Traffic, &token, "sb1"), None);
    }
}
