//! `Idempotency-Key` on create: the same key with the same body makes one
//! sandbox however often it is sent (the Python SDK resends a create
//! that failed on its way back); with another body it is a 409.
//!
//! Keys are remembered per delegate, for a day, in memory (at most
//! [`MAX_REMEMBERED`]); each sandbox also carries its key and body's hash
//! as a label, so a face started again finds the sandbox a key made.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use agentos_proto::payload::DelegateName;
use http::StatusCode;
use sha2::{Digest, Sha256};

use crate::answer::ApiError;

/// How long a key is remembered.
const REMEMBERED_FOR: Duration = Duration::from_secs(24 * 3600);

/// Keys remembered at most, across every delegate; the oldest go first.
const MAX_REMEMBERED: usize = 4096;

/// The longest key the SDK sends.
const MAX_KEY_LEN: usize = 255;

/// What a key's create came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It is being made.
    InFlight,
    /// It made this sandbox, from this template.
    Made { sandbox: String, template: String },
}

#[derive(Debug)]
struct Remembered {
    body_hash: String,
    outcome: Outcome,
    at: Instant,
}

/// The keys seen, per delegate.
#[derive(Debug, Default)]
pub struct Idempotency {
    keys: HashMap<(DelegateName, String), Remembered>,
}

/// A create's key and its body's hash: what its sandbox's label holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub key: String,
    pub body_hash: String,
}

impl Claim {
    /// The claim of a create with key `key` and body `body`, or why the
    /// key is not one.
    pub fn new(key: &str, body: &[u8]) -> Result<Claim, ApiError> {
        let fits = !key.is_empty()
            && key.len() <= MAX_KEY_LEN
            && key
                .bytes()
                .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-');
        if !fits {
            return Err(ApiError::bad_request(format!(
                "Idempotency-Key: give 1 to {MAX_KEY_LEN} of a-z 0-9 -"
            )));
        }
        let hash = Sha256::digest(body);
        let body_hash = hash[..16]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Ok(Claim {
            key: key.to_owned(),
            body_hash,
        })
    }

    /// The label's value.
    pub fn label(&self) -> String {
        format!("{} {}", self.key, self.body_hash)
    }

    /// The claim a label holds.
    pub fn of_label(label: &str) -> Option<Claim> {
        let (key, body_hash) = label.split_once(' ')?;
        Some(Claim {
            key: key.to_owned(),
            body_hash: body_hash.to_owned(),
        })
    }

    /// A 409 if `earlier` was this key with another body.
    pub fn check_same_body(&self, earlier: &Claim) -> Result<(), ApiError> {
        if earlier.body_hash != self.body_hash {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Idempotency-Key {:?} was used with another request body",
                    self.key
                ),
            )
            .with_code("idempotency_request_mismatch"));
        }
        Ok(())
    }
}

impl Idempotency {
    /// What an earlier create with this claim's key came to, or none:
    /// then this create is the key's, in flight until [`Idempotency::made`]
    /// or [`Idempotency::failed`].
    pub fn begin(
        &mut self,
        delegate: DelegateName,
        claim: &Claim,
        now: Instant,
    ) -> Result<Option<Outcome>, ApiError> {
        self.keys
            .retain(|_, remembered| now.duration_since(remembered.at) < REMEMBERED_FOR);
        let slot = (delegate, claim.key.clone());
        if let Some(remembered) = self.keys.get(&slot) {
            claim.check_same_body(&Claim {
                key: claim.key.clone(),
                body_hash: remembered.body_hash.clone(),
            })?;
            if remembered.outcome == Outcome::InFlight {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!(
                        "a create with Idempotency-Key {:?} is in progress",
                        claim.key
                    ),
                )
                .with_code("idempotency_in_progress"));
            }
            return Ok(Some(remembered.outcome.clone()));
        }
        if self.keys.len() >= MAX_REMEMBERED {
            if let Some(oldest) = self
                .keys
                .iter()
                .min_by_key(|(_, remembered)| remembered.at)
                .map(|(slot, _)| slot.clone())
            {
                self.keys.remove(&oldest);
            }
        }
        self.keys.insert(
            slot,
            Remembered {
                body_hash: claim.body_hash.clone(),
                outcome: Outcome::InFlight,
                at: now,
            },
        );
        Ok(None)
    }

    /// The key's create made `sandbox`.
    pub fn made(&mut self, delegate: DelegateName, claim: &Claim, sandbox: &str, template: &str) {
        if let Some(remembered) = self.keys.get_mut(&(delegate, claim.key.clone())) {
            remembered.outcome = Outcome::Made {
                sandbox: sandbox.to_owned(),
                template: template.to_owned(),
            };
        }
    }

    /// The key's create made nothing: it may be tried again.
    pub fn failed(&mut self, delegate: DelegateName, claim: &Claim) {
        self.keys.remove(&(delegate, claim.key.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_makes_one_sandbox_and_another_body_or_a_second_in_flight_is_a_conflict() {
        let mut seen = Idempotency::default();
        let alice = DelegateName::new("e2b.alice").unwrap();
        let bob = DelegateName::new("e2b.bob").unwrap();
        let now = Instant::now();
        let claim = Claim::new("k-1", b"{}").unwrap();
        assert_eq!(seen.begin(alice, &claim, now).unwrap(), None);
        let again = seen.begin(alice, &claim, now).unwrap_err();
        assert_eq!(again.error_code, Some("idempotency_in_progress"));
        // Another delegate's key of the same name is its own.
        assert_eq!(seen.begin(bob, &claim, now).unwrap(), None);
        seen.made(alice, &claim, "sb1", "base");
        let made = Outcome::Made {
            sandbox: "sb1".into(),
            template: "base".into(),
        };
        assert_eq!(seen.begin(alice, &claim, now).unwrap(), Some(made));
        let other = Claim::new("k-1", b"{\"timeout\":5}").unwrap();
        let mismatch = seen.begin(alice, &other, now).unwrap_err();
        assert_eq!(mismatch.error_code, Some("idempotency_request_mismatch"));
        seen.failed(bob, &claim);
        assert_eq!(seen.begin(bob, &claim, now).unwrap(), None);
        let later = now + REMEMBERED_FOR;
        assert_eq!(seen.begin(alice, &other, later).unwrap(), None);
    }

    #[test]
    fn a_key_is_lower_case_letters_digits_and_dashes_and_its_label_reads_back() {
        for bad in ["", "A", "a b", "a_b", &"a".repeat(256)] {
            assert!(Claim::new(bad, b"").is_err(), "{bad:?}");
        }
        let claim = Claim::new("order-42", b"body").unwrap();
        assert_eq!(Claim::of_label(&claim.label()), Some(claim));
    }
}
