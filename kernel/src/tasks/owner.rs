//! Whose a task is: a [`Principal`] and, for an agent or a run, the life
//! of the kernel it belonged to. Agents and runs do not outlive the kernel
//! (a later kernel's agent 7 is another agent), so their claim on tasks is
//! tied to the boot; an operator's tasks are theirs across restarts.
//!
//! In memory owners are compared as values; the text form
//! (`user:<uid>`, `agent:<boot>:<id>`, `run:<boot>:<number>`, the boot in
//! hex) is the store's column alone.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use agentos_proto::payload::{DelegateName, PrincipalInfo};

use crate::identity::Principal;

/// Whose a task is, for as long as the task is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    principal: Principal,
    /// The boot of the kernel whose agent or run it is; `None` for an
    /// operator, whose tasks outlive every kernel.
    boot: Option<u64>,
}

impl OwnerKey {
    /// `principal` of the kernel of boot `boot`.
    pub fn new(principal: Principal, boot: u64) -> OwnerKey {
        let boot = match principal {
            Principal::Operator { .. } | Principal::Delegate { .. } => None,
            Principal::Agent { .. } | Principal::Run { .. } => Some(boot),
        };
        OwnerKey { principal, boot }
    }

    /// Whom the tasks are for.
    pub fn principal(self) -> Principal {
        self.principal
    }

    /// Whether the owner outlives the kernel: an operator, or a delegate
    /// (which is whoever names it again).
    pub fn outlives_kernels(self) -> bool {
        self.boot.is_none()
    }

    /// Whether the owner is still who it was in the kernel of boot `boot`:
    /// an operator always, an agent or a run only in its own kernel's life.
    pub fn is_of_boot(self, boot: u64) -> bool {
        self.boot.is_none_or(|own| own == boot)
    }

    /// Whose the tasks are, as a list says it: a principal of the kernel
    /// of boot `boot` by what `describe` knows of it, an earlier kernel's
    /// agent or run by its number alone (this kernel's may have the same).
    pub fn describe(
        self,
        boot: u64,
        describe: &dyn Fn(Principal) -> PrincipalInfo,
    ) -> PrincipalInfo {
        if self.is_of_boot(boot) {
            return describe(self.principal);
        }
        match self.principal {
            Principal::Agent { id } => PrincipalInfo::Agent { id, name: None },
            Principal::Run { .. } => PrincipalInfo::Run { of: None },
            Principal::Operator { .. } | Principal::Delegate { .. } => describe(self.principal),
        }
    }
}

/// The store's column: `user:<uid>`, `delegate:<uid>:<name>`,
/// `agent:<boot>:<id>`, `run:<boot>:<number>`.
impl fmt::Display for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let boot = self.boot.unwrap_or(0);
        match self.principal {
            Principal::Operator { uid } => write!(f, "user:{uid}"),
            Principal::Delegate { uid, name } => write!(f, "delegate:{uid}:{name}"),
            Principal::Agent { id } => write!(f, "agent:{boot:x}:{id}"),
            Principal::Run { number } => write!(f, "run:{boot:x}:{number}"),
        }
    }
}

/// A store's owner column that names no owner.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} names no task owner (user:<uid>, delegate:<uid>:<name>, agent:<boot>:<id> or \
     run:<boot>:<number>)"
)]
pub struct OwnerKeyError {
    /// The column as it was.
    pub text: String,
}

impl FromStr for OwnerKey {
    type Err = OwnerKeyError;

    fn from_str(text: &str) -> Result<OwnerKey, OwnerKeyError> {
        let error = || OwnerKeyError {
            text: text.to_owned(),
        };
        let mut parts = text.split(':');
        let kind = parts.next().ok_or_else(error)?;
        let key = if kind == "user" || kind == "delegate" {
            let uid = parts.next().and_then(|uid| uid.parse().ok());
            let uid = uid.ok_or_else(error)?;
            let principal = match kind {
                "user" => Principal::Operator { uid },
                _ => Principal::Delegate {
                    uid,
                    name: parts
                        .next()
                        .and_then(|name| DelegateName::new(name).ok())
                        .ok_or_else(error)?,
                },
            };
            OwnerKey {
                principal,
                boot: None,
            }
        } else {
            let boot = parts
                .next()
                .and_then(|boot| u64::from_str_radix(boot, 16).ok());
            let boot = boot.ok_or_else(error)?;
            let number = parts.next().ok_or_else(error)?;
            let principal = match kind {
                "agent" => Principal::Agent {
                    id: number.parse().map_err(|_| error())?,
                },
                "run" => Principal::Run {
                    number: number.parse().map_err(|_| error())?,
                },
                _ => return Err(error()),
            };
            OwnerKey {
                principal,
                boot: Some(boot),
            }
        };
        match parts.next() {
            Some(_) => Err(error()),
            None => Ok(key),
        }
    }
}

/// Which tasks a request reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// One principal's, of this kernel's life: everyone else's are
    /// `not_found`.
    Own(Principal),
    /// Every owner's (an operator's reach).
    Any,
}

impl Reach {
    /// The one owner it reaches, in the kernel of boot `boot`; `None`:
    /// every owner.
    pub fn owner(self, boot: u64) -> Option<OwnerKey> {
        match self {
            Reach::Own(principal) => Some(OwnerKey::new(principal, boot)),
            Reach::Any => None,
        }
    }
}

/// How many of something each owner has. An owner with none left is
/// forgotten, so owners that come and go (runs) leave nothing behind.
#[derive(Debug, Default)]
pub struct PerOwner(HashMap<OwnerKey, usize>);

impl PerOwner {
    /// `owner`'s count.
    pub fn of(&self, owner: OwnerKey) -> usize {
        self.0.get(&owner).copied().unwrap_or(0)
    }

    /// One more of `owner`'s.
    pub fn add(&mut self, owner: OwnerKey) {
        *self.0.entry(owner).or_default() += 1;
    }

    /// One fewer of `owner`'s.
    pub fn remove(&mut self, owner: OwnerKey) {
        if let Some(count) = self.0.get_mut(&owner) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.0.remove(&owner);
            }
        }
    }

    /// Whether no owner has any.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: u64 = 0xab12;

    #[test]
    fn owners_are_stored_as_they_always_were_and_read_back_the_same() {
        for (principal, text) in [
            (Principal::Operator { uid: 1000 }, "user:1000"),
            (
                Principal::Delegate {
                    uid: 1000,
                    name: DelegateName::new("e2b.key-1").unwrap(),
                },
                "delegate:1000:e2b.key-1",
            ),
            (Principal::Agent { id: 7 }, "agent:ab12:7"),
            (Principal::Run { number: 42 }, "run:ab12:42"),
        ] {
            let key = OwnerKey::new(principal, BOOT);
            assert_eq!(key.to_string(), text);
            assert_eq!(text.parse::<OwnerKey>(), Ok(key));
        }
    }

    #[test]
    fn an_operators_tasks_are_theirs_in_every_kernel_an_agents_only_in_its_own() {
        let operator = OwnerKey::new(Principal::Operator { uid: 0 }, BOOT);
        assert_eq!(operator, OwnerKey::new(Principal::Operator { uid: 0 }, 1));
        assert!(operator.is_of_boot(1) && operator.is_of_boot(BOOT));
        let name = DelegateName::new("k").unwrap();
        let delegate = OwnerKey::new(Principal::Delegate { uid: 0, name }, BOOT);
        assert!(delegate.outlives_kernels() && delegate.is_of_boot(1));
        assert_ne!(delegate, operator);
        let agent = OwnerKey::new(Principal::Agent { id: 3 }, BOOT);
        assert_ne!(agent, OwnerKey::new(Principal::Agent { id: 3 }, 1));
        assert!(agent.is_of_boot(BOOT) && !agent.is_of_boot(1));
    }

    #[test]
    fn an_earlier_kernels_agent_or_run_is_described_by_its_number_alone() {
        let known = |principal| match principal {
            Principal::Agent { id } => PrincipalInfo::Agent {
                id,
                name: Some("worker1".into()),
            },
            Principal::Run { .. } => PrincipalInfo::Run { of: None },
            Principal::Operator { uid } | Principal::Delegate { uid, .. } => {
                PrincipalInfo::Operator { uid }
            }
        };
        let agent: OwnerKey = "agent:1:7".parse().unwrap();
        assert_eq!(
            agent.describe(1, &known),
            PrincipalInfo::Agent {
                id: 7,
                name: Some("worker1".into())
            }
        );
        assert_eq!(
            agent.describe(2, &known),
            PrincipalInfo::Agent { id: 7, name: None }
        );
    }

    #[test]
    fn a_column_that_names_no_owner_is_an_error_naming_it() {
        for text in [
            "",
            "user:",
            "user:x",
            "user:1:2",
            "agent:7",
            "agent:zz:7",
            "agent:1:-7",
            "run:1",
            "robot:1:2",
            "agent:1:2:3",
            "delegate:1",
            "delegate:1:",
            "delegate:1:../x",
            "delegate:x:k",
            "delegate:1:k:2",
        ] {
            let err = text.parse::<OwnerKey>().unwrap_err();
            assert_eq!(err.text, text);
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
    }
}
