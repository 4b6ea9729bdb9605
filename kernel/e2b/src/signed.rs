//! Signed `/files` URLs (`download_url`, `upload_url`): they carry no
//! token and, with `E2B_SANDBOX_URL` set, no sandbox either — only a
//! signature made with the sandbox's access token:
//! `v1_` + base64(SHA-256("PATH:OPERATION:USER:TOKEN[:EXPIRATION]")),
//! unpadded. The face finds the sandbox whose token makes that signature
//! among every key's sandboxes, and refuses an expired one.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use http::{Method, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::answer::ApiError;
use crate::envd::session::Session;
use crate::face::Face;
use crate::query::query_pairs;
use crate::tenant::Tenant;

/// What a signed URL says.
#[derive(Debug, Default)]
struct Signed {
    path: String,
    username: String,
    signature: String,
    expiration: Option<String>,
}

/// The signature of a request for `path` by `username`, made with
/// `token`.
fn signature(signed: &Signed, operation: &str, token: &str) -> String {
    let mut raw = format!("{}:{operation}:{}:{token}", signed.path, signed.username);
    if let Some(expiration) = &signed.expiration {
        raw.push(':');
        raw.push_str(expiration);
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

/// The sandbox a signed `/files` request is for, or a 401.
pub async fn sandbox_of(face: &Face, method: &Method, query: &str) -> Result<Session, ApiError> {
    let unauthorized = |why: &str| ApiError::new(StatusCode::UNAUTHORIZED, why.to_owned());
    let mut signed = Signed::default();
    for (name, value) in query_pairs(query) {
        match name.as_str() {
            "path" => signed.path = value,
            "username" => signed.username = value,
            "signature" => signed.signature = value,
            "signature_expiration" => signed.expiration = Some(value),
            _ => {}
        }
    }
    if let Some(expiration) = &signed.expiration {
        let at: u64 = expiration
            .parse()
            .map_err(|_| unauthorized("signature_expiration is not a time"))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        if at < now {
            return Err(unauthorized("signature is already expired"));
        }
    }
    let operation = if method == Method::GET {
        "read"
    } else {
        "write"
    };
    for delegate in face.keys.delegates() {
        let tenant = Tenant::new(&face.kernel, delegate);
        for sandbox in tenant.sandboxes().await? {
            let token = face.tokens.mint(delegate, &sandbox.session);
            let expected = signature(&signed, operation, &token);
            if bool::from(expected.as_bytes().ct_eq(signed.signature.as_bytes())) {
                return Ok(Session {
                    tenant,
                    id: sandbox.session,
                });
            }
        }
    }
    Err(unauthorized("the signature is not one of a sandbox's"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_the_sdks() {
        // What e2b's signature.py makes for these values.
        let signed = Signed {
            path: "/home/user/a.txt".into(),
            username: String::new(),
            ..Signed::default()
        };
        let made = signature(&signed, "read", "token");
        let raw = "/home/user/a.txt:read::token";
        let expected = format!("v1_{}", STANDARD_NO_PAD.encode(Sha256::digest(raw)));
        assert_eq!(made, expected);
        assert!(!made.ends_with('='));
        let expiring = Signed {
            expiration: Some("1700000000".into()),
            ..signed
        };
        assert_ne!(signature(&expiring, "read", "token"), made);
    }
}
