//! Who is asking, and what it may do: an operator; an agent, within what
//! its SPAWN gave it; or an EXEC run, within what its EXEC request gave it.
//!
//! Code that EXEC runs — an LLM's included — is hostile, so a run is a
//! principal of its own, never its caller. The kernel connection inside a
//! run speaks for the run: by default it may use TOOL (within the caller's
//! tools) and THINK (charged to the caller), and what EXEC's `permissions`
//! added — checked as a SPAWN's would be, never more than the caller has,
//! and never more than a sandboxed agent may have. A run's own work (the
//! agents it spawned, its runs, sessions and tasks) is the run's alone, and
//! ends when the run does.

use agentos_egress::policy::Policy;
use agentos_egress::Egress;
use agentos_proto::payload::{DelegateName, ExecRequest, Limits, Permissions};
use agentos_proto::{ErrorCode, ErrorReply};

use super::runs::{Root, RunGrant, Runs};
use crate::address::ReplyTo;
use crate::agents::{AgentGrant, Agents, Viewer};
use crate::cgroup::CgroupLimits;
use crate::exec::Share;
use crate::identity::Principal;
use crate::permissions::Budget;
use crate::permissions::{beyond_caller, covered_by};

/// Who is asking, with what it was given.
#[derive(Clone, Copy, Debug)]
pub enum Actor<'a> {
    /// An operator: anything the protocol allows, unless its connection
    /// lowered itself (GET/SET_PERMS).
    Operator {
        /// Its user id.
        uid: u32,
        /// What its connection kept after lowering itself, if it did.
        lowered: Option<&'a Permissions>,
    },
    /// An agent, within its grant.
    Agent {
        /// Its id.
        id: u32,
        /// What it was given.
        grant: AgentGrant<'a>,
    },
    /// A delegate an operator named: the operator's powers (its lowered
    /// ones, if its connection lowered itself) narrowed to THINK, EXEC
    /// and TASK.
    Delegate {
        /// The operator's user id.
        uid: u32,
        /// Its name.
        name: DelegateName,
        /// What its connection kept after lowering itself, if it did.
        lowered: Option<&'a Permissions>,
    },
    /// An EXEC run, within what its request gave it.
    Run {
        /// Its number.
        number: u64,
        /// What it was given.
        grant: &'a RunGrant,
    },
}

impl<'a> Actor<'a> {
    /// Who `principal` is, with what it was given; an agent the kernel
    /// does not know (any more), or a run that is over, is refused.
    pub fn of(
        principal: Principal,
        agents: &'a Agents,
        runs: &'a Runs,
    ) -> Result<Self, ErrorReply> {
        match principal {
            Principal::Operator { uid } => Ok(Actor::Operator { uid, lowered: None }),
            Principal::Delegate { uid, name } => Ok(Actor::Delegate {
                uid,
                name,
                lowered: None,
            }),
            Principal::Agent { id } => agents
                .grant(id)
                .map(|grant| Actor::Agent { id, grant })
                .ok_or_else(|| {
                    ErrorReply::new(
                        ErrorCode::PermissionDenied,
                        format!("agent {id} is not known"),
                    )
                }),
            Principal::Run { number } => runs
                .get(number)
                .map(|grant| Actor::Run { number, grant })
                .ok_or_else(|| {
                    ErrorReply::new(ErrorCode::PermissionDenied, "this EXEC run is over")
                }),
        }
    }

    /// The same, on a connection that lowered itself to `lowered`
    /// (SET_PERMS): an operator or a delegate holds to it; an agent or a
    /// run was lowered for good where it is kept.
    pub fn lowered_to(self, lowered: Option<&'a Permissions>) -> Actor<'a> {
        match self {
            Actor::Operator { uid, .. } => Actor::Operator { uid, lowered },
            Actor::Delegate { uid, name, .. } => Actor::Delegate { uid, name, lowered },
            Actor::Agent { .. } | Actor::Run { .. } => self,
        }
    }

    /// The principal it is.
    pub fn principal(&self) -> Principal {
        match *self {
            Actor::Operator { uid, .. } => Principal::Operator { uid },
            Actor::Delegate { uid, name, .. } => Principal::Delegate { uid, name },
            Actor::Agent { id, .. } => Principal::Agent { id },
            Actor::Run { number, .. } => Principal::Run { number },
        }
    }

    /// The operator or agent at the end of its chain of callers.
    pub fn root(&self) -> Root {
        match *self {
            Actor::Operator { uid, .. } => Root::Operator(uid),
            Actor::Delegate { uid, name, .. } => Root::Delegate(uid, name),
            Actor::Agent { id, .. } => Root::Agent(id),
            Actor::Run { grant, .. } => grant.root,
        }
    }

    /// How it sees the agents table.
    pub fn viewer(&self) -> Viewer {
        match *self {
            Actor::Operator { .. } => Viewer::Operator,
            Actor::Delegate { .. } => Viewer::Nobody,
            Actor::Agent { id, .. } => Viewer::Agent(id),
            Actor::Run { number, .. } => Viewer::Run(number),
        }
    }

    /// Whose share of EXEC its runs count against: an agent's whole tree,
    /// an operator's uid, or a delegate (a run's, its root's).
    pub fn share(&self, agents: &Agents) -> Share {
        match self.root() {
            Root::Agent(id) => Share::Tree(agents.root_of(id)),
            Root::Operator(uid) => Share::Operator(uid),
            Root::Delegate(uid, name) => Share::Delegate(uid, name),
        }
    }

    /// How it is named in refusals.
    pub fn name(&self) -> String {
        match self {
            Actor::Operator { uid, .. } => format!("operator uid {uid}"),
            Actor::Delegate { uid, name, .. } => format!("delegate {name:?} of operator uid {uid}"),
            Actor::Agent { grant, .. } => format!("agent {}", grant.name),
            Actor::Run { number, .. } => format!("EXEC run {number}"),
        }
    }

    /// What it may do, as a bound on what it may give.
    fn powers(&self) -> Powers<'_> {
        match self {
            Actor::Operator { lowered, .. } => {
                let kept = |bit: fn(&Permissions) -> bool| lowered.is_none_or(bit);
                Powers {
                    think: kept(|p| p.think),
                    exec: kept(|p| p.exec),
                    spawn: kept(|p| p.spawn),
                    task: kept(|p| p.task),
                    read: kept(|p| p.read),
                    write: kept(|p| p.write),
                    http: kept(|p| p.http),
                    ipc: kept(|p| p.ipc),
                    tools: None,
                    network: &Egress::Host,
                    limits: Limits::default(),
                    budgets: &[],
                }
            }
            Actor::Delegate { lowered, .. } => {
                let kept = |bit: fn(&Permissions) -> bool| lowered.is_none_or(bit);
                Powers {
                    think: kept(|p| p.think),
                    exec: kept(|p| p.exec),
                    spawn: false,
                    task: kept(|p| p.task),
                    read: false,
                    write: false,
                    http: false,
                    ipc: false,
                    // The kernel's tools carry their servers' credentials,
                    // which are the operator's, not a tenant's.
                    tools: Some(&[]),
                    network: &Egress::Host,
                    limits: Limits::default(),
                    budgets: &[],
                }
            }
            Actor::Agent { grant, .. } => Powers {
                think: grant.permissions.think,
                exec: grant.permissions.exec,
                spawn: grant.permissions.spawn,
                // An agent dispatches the tasks its other permissions allow.
                task: grant.permissions.task && (grant.permissions.exec || grant.permissions.think),
                read: grant.permissions.read,
                write: grant.permissions.write,
                http: grant.permissions.http,
                ipc: grant.permissions.ipc,
                tools: Some(&grant.permissions.tools),
                network: grant.network,
                limits: grant.limits,
                budgets: grant.budgets,
            },
            Actor::Run { grant, .. } => Powers {
                think: grant.permissions.think,
                exec: grant.permissions.exec,
                spawn: grant.permissions.spawn,
                task: grant.permissions.task,
                read: grant.permissions.read,
                write: grant.permissions.write,
                http: grant.permissions.http,
                ipc: grant.permissions.ipc,
                tools: Some(&grant.permissions.tools),
                network: &grant.network,
                limits: grant.limits,
                budgets: &grant.budgets,
            },
        }
    }

    /// What it may do now, as GET_PERMS reports it.
    pub fn permissions(&self) -> Permissions {
        let powers = self.powers();
        let llm_tokens = match self {
            Actor::Operator { .. } | Actor::Delegate { .. } => 0,
            Actor::Agent { grant, .. } => grant.permissions.llm_tokens,
            Actor::Run { grant, .. } => grant.permissions.llm_tokens,
        };
        Permissions {
            think: powers.think,
            exec: powers.exec,
            spawn: powers.spawn,
            task: powers.task,
            read: powers.read,
            write: powers.write,
            http: powers.http,
            ipc: powers.ipc,
            llm_tokens,
            tools: powers
                .tools
                .map_or_else(|| vec!["*".to_owned()], <[String]>::to_vec),
        }
    }

    /// Its own limits, which bound its runs' (an operator has none).
    pub fn limits(&self) -> Limits {
        self.powers().limits
    }

    /// What it may reach, which bounds what it may give.
    pub fn network(&self) -> &Egress {
        self.powers().network
    }

    /// The token budgets it draws on.
    pub fn budgets(&self) -> &[Budget] {
        self.powers().budgets
    }

    /// The tool patterns it is held to (`None`: every tool).
    pub fn tools(&self) -> Option<&[String]> {
        self.powers().tools
    }

    /// Whether it has `what`; if not, why not.
    pub fn require(&self, what: Permission) -> Result<(), ErrorReply> {
        let powers = self.powers();
        let (has, field) = match what {
            Permission::Think => (powers.think, "think"),
            Permission::Exec => (powers.exec, "exec"),
            Permission::Spawn => (powers.spawn, "spawn"),
            Permission::Task => (powers.task, "task"),
            Permission::Read => (powers.read, "read"),
            Permission::Write => (powers.write, "write"),
            Permission::Http => (powers.http, "http"),
        };
        if has {
            return Ok(());
        }
        let whose = match self {
            Actor::Run { .. } => "its EXEC request's permissions",
            _ => "its permissions",
        };
        Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "{} may not {} ({whose}.{field} is false)",
                self.name(),
                what.verb()
            ),
        ))
    }

    /// What a run it asks for may do: `request`'s `permissions` and
    /// `network`, each within what this caller has (never more than a
    /// sandboxed agent may be given: a run never shares the host's view,
    /// never spawns unsandboxed, and reaches only what it starts itself).
    /// `limits` are the run's, already within the caller's; `tokens_left`
    /// what the caller's budgets still allow; `default_policy` the
    /// kernel's, for a request without `network`.
    pub fn grant_run(
        &self,
        request: &ExecRequest,
        limits: &CgroupLimits,
        tokens_left: Option<u64>,
        default_policy: Option<&Policy>,
        reply_to: ReplyTo,
        number: u64,
    ) -> Result<RunGrant, ErrorReply> {
        let powers = self.powers();
        let asked = request.permissions.clone().unwrap_or_default();
        for (field, asked, has) in [
            ("think", asked.think, powers.think),
            ("exec", asked.exec, powers.exec),
            ("spawn", asked.spawn, powers.spawn),
            ("task", asked.task, powers.task),
        ] {
            if asked == Some(true) && !has {
                return Err(beyond_caller(
                    &format!("permissions.{field}"),
                    &format!("{} does not have it", self.name()),
                ));
            }
        }
        // One level of nesting: a run's runs hold places of their own while
        // it waits for them, so deeper chains would only wait on each other.
        if asked.exec == Some(true) && matches!(self, Actor::Run { .. }) {
            return Err(beyond_caller(
                "permissions.exec",
                "a run's own runs may not run code of their own (one level of nesting)",
            ));
        }
        let network = match &request.network {
            Some(asked) => {
                Egress::from_request("EXEC", asked)?.within(powers.network, &self.name())?
            }
            None => Egress::default_within(default_policy, powers.network),
        };
        if network == Egress::Host {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "EXEC field `network`: a run never shares the host's network; give it a \
                 policy (`{\"allow\": [...]}`) of what it may reach through the kernel's proxy",
            ));
        }
        let tools = match (&asked.tools, powers.tools) {
            (Some(wanted), Some(own)) => {
                if let Some(wider) = wanted.iter().find(|p| !covered_by(own, p)) {
                    return Err(beyond_caller(
                        "permissions.tools",
                        &format!("{wider:?} allows tools {}'s {own:?} do not", self.name()),
                    ));
                }
                wanted.clone()
            }
            (Some(wanted), None) => wanted.clone(),
            (None, Some(own)) => own.to_vec(),
            (None, None) => vec!["*".to_owned()],
        };
        let own_tokens = asked.llm_tokens.unwrap_or(0);
        if let Some(left) = tokens_left.filter(|left| own_tokens > *left) {
            return Err(beyond_caller(
                "permissions.llm_tokens",
                &format!(
                    "asks for {own_tokens} tokens; {}'s budget has {left} left",
                    self.name()
                ),
            ));
        }
        let budgets = (own_tokens > 0)
            .then_some(Budget {
                owner: Runs::budget_key(number),
                tokens: own_tokens,
            })
            .into_iter()
            .chain(powers.budgets.iter().copied())
            .collect();
        Ok(RunGrant {
            of: self.principal(),
            root: self.root(),
            permissions: Permissions {
                think: asked.think.unwrap_or(powers.think),
                exec: asked.exec.unwrap_or(false),
                spawn: asked.spawn.unwrap_or(false),
                task: asked.task.unwrap_or(false),
                read: powers.read,
                write: powers.write,
                http: powers.http,
                // A run messages only its caller and its caller's operator,
                // as a sandboxed child without `ipc` would.
                ipc: false,
                llm_tokens: own_tokens,
                tools,
            },
            limits: Limits {
                memory: Some(limits.memory),
                cpu_quota: limits.cpu_quota,
                cpu_period: Some(limits.cpu_period),
                max_pids: Some(limits.max_pids.saturating_sub(1).max(1)),
            },
            network,
            budgets,
            reply_to,
        })
    }
}

/// What an actor may do.
struct Powers<'a> {
    think: bool,
    exec: bool,
    spawn: bool,
    task: bool,
    read: bool,
    write: bool,
    http: bool,
    ipc: bool,
    /// `None`: every tool.
    tools: Option<&'a [String]>,
    network: &'a Egress,
    limits: Limits,
    budgets: &'a [Budget],
}

/// A permission a request needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    /// THINK.
    Think,
    /// EXEC.
    Exec,
    /// SPAWN.
    Spawn,
    /// TASK.
    Task,
    /// READ a file.
    Read,
    /// WRITE a file.
    Write,
    /// Make an HTTP request.
    Http,
}

impl Permission {
    fn verb(self) -> &'static str {
        match self {
            Permission::Think => "THINK",
            Permission::Exec => "EXEC",
            Permission::Spawn => "spawn agents",
            Permission::Task => "dispatch TASKs",
            Permission::Read => "READ files",
            Permission::Write => "WRITE files",
            Permission::Http => "make HTTP requests",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ConnKey;

    fn reply_to() -> ReplyTo {
        ReplyTo::Request {
            conn: ConnKey {
                index: 0,
                serial: 1,
            },
            seq: 1,
        }
    }

    fn limits() -> CgroupLimits {
        CgroupLimits {
            memory: 64 << 20,
            cpu_quota: None,
            cpu_period: 100_000,
            max_pids: 65,
        }
    }

    fn run_of(actor: &Actor<'_>, json: &str) -> Result<RunGrant, ErrorReply> {
        let request = ExecRequest::parse(json.as_bytes()).unwrap();
        actor.grant_run(&request, &limits(), Some(500), None, reply_to(), 1)
    }

    #[test]
    fn an_operators_run_gets_tools_and_think_only_by_default() {
        let operator = Actor::Operator {
            uid: 0,
            lowered: None,
        };
        let grant = run_of(&operator, r#"{"code":"1"}"#).unwrap();
        assert_eq!(grant.of, Principal::Operator { uid: 0 });
        assert!(grant.permissions.think);
        assert!(!grant.permissions.spawn && !grant.permissions.exec && !grant.permissions.task);
        assert_eq!(grant.permissions.tools, ["*"]);
        assert_eq!(grant.network, Egress::Loopback);
        assert_eq!(grant.limits.memory, Some(64 << 20));
        assert_eq!(grant.limits.max_pids, Some(64), "the waiting parent aside");
    }

    #[test]
    fn a_delegate_has_only_think_exec_and_task_and_its_runs_no_more() {
        let name = DelegateName::new("key-1").unwrap();
        let lowered = Permissions {
            task: false,
            ..Permissions::default()
        };
        let delegate = Actor::Delegate {
            uid: 1000,
            name,
            lowered: None,
        };
        for (what, has) in [
            (Permission::Think, true),
            (Permission::Exec, true),
            (Permission::Task, true),
            (Permission::Spawn, false),
            (Permission::Read, false),
            (Permission::Write, false),
            (Permission::Http, false),
        ] {
            assert_eq!(delegate.require(what).is_ok(), has, "{what:?}");
        }
        assert_eq!(
            delegate.principal(),
            Principal::Delegate { uid: 1000, name }
        );
        assert_eq!(delegate.root(), Root::Delegate(1000, name));
        assert_eq!(delegate.tools(), Some(&[][..]));
        let grant = run_of(&delegate, r#"{"code":"1"}"#).unwrap();
        assert_eq!(grant.permissions.tools, Vec::<String>::new());
        assert!(run_of(&delegate, r#"{"code":"1","permissions":{"spawn":true}}"#).is_err());
        assert!(run_of(&delegate, r#"{"code":"1","permissions":{"tools":["*"]}}"#).is_err());
        // A connection that lowered itself stays lowered as a delegate.
        let lowered = Actor::Delegate {
            uid: 1000,
            name,
            lowered: Some(&lowered),
        };
        assert!(lowered.require(Permission::Task).is_err());
    }

    #[test]
    fn a_run_never_gets_more_than_its_caller() {
        let permissions = Permissions {
            think: false,
            exec: true,
            spawn: false,
            task: true,
            read: true,
            write: true,
            http: true,
            ipc: false,
            llm_tokens: 0,
            tools: vec!["time.*".into()],
        };
        let budgets = [Budget {
            owner: 7,
            tokens: 1000,
        }];
        let agent = Actor::Agent {
            id: 7,
            grant: AgentGrant {
                name: "w",
                permissions: &permissions,
                limits: Limits::default(),
                network: &Egress::Loopback,
                budgets: &budgets,
            },
        };
        for (json, field) in [
            (
                r#"{"code":"1","permissions":{"spawn":true}}"#,
                "permissions.spawn",
            ),
            (
                r#"{"code":"1","permissions":{"think":true}}"#,
                "permissions.think",
            ),
            (
                r#"{"code":"1","permissions":{"tools":["*"]}}"#,
                "permissions.tools",
            ),
            (
                r#"{"code":"1","permissions":{"llm_tokens":501}}"#,
                "permissions.llm_tokens",
            ),
            (r#"{"code":"1","network":true}"#, "network"),
            (
                r#"{"code":"1","network":{"allow":["pypi.org"]}}"#,
                "network",
            ),
        ] {
            let err = run_of(&agent, json).unwrap_err();
            assert_eq!(err.code, ErrorCode::PermissionDenied, "{json}");
            assert!(err.error.contains(field), "{json}: {}", err.error);
        }
        let grant = run_of(
            &agent,
            r#"{"code":"1","permissions":{"exec":true,"task":true,"llm_tokens":300}}"#,
        )
        .unwrap();
        assert!(grant.permissions.exec && grant.permissions.task && !grant.permissions.think);
        assert_eq!(grant.permissions.tools, ["time.*"]);
        assert_eq!(grant.budgets.len(), 2, "its own, then the agent's");
        assert_eq!(grant.root, Root::Agent(7));
    }

    #[test]
    fn a_run_of_a_run_is_held_to_the_first_runs_grant() {
        let operator = Actor::Operator {
            uid: 0,
            lowered: None,
        };
        let first = run_of(&operator, r#"{"code":"1","permissions":{"exec":true}}"#).unwrap();
        let run = Actor::Run {
            number: 4,
            grant: &first,
        };
        let err = run_of(&run, r#"{"code":"1","permissions":{"spawn":true}}"#).unwrap_err();
        assert!(err.error.contains("permissions.spawn"), "{}", err.error);
        let nested = run_of(&run, r#"{"code":"1"}"#).unwrap();
        assert_eq!(nested.of, Principal::Run { number: 4 });
        assert_eq!(nested.root, Root::Operator(0));
        assert!(run.require(Permission::Exec).is_ok());
        assert!(run.require(Permission::Spawn).is_err());
        assert!(run.require(Permission::Task).is_err());
    }

    #[test]
    fn a_runs_policy_lies_within_its_callers_and_never_is_the_host_network() {
        let operator = Actor::Operator {
            uid: 0,
            lowered: None,
        };
        let host = run_of(&operator, r#"{"code":"1","network":true}"#).unwrap_err();
        assert_eq!(host.code, ErrorCode::Unavailable);
        let first = run_of(
            &operator,
            r#"{"code":"1","network":{"allow":["*.example.com:443"]},"permissions":{"exec":true}}"#,
        )
        .unwrap();
        assert!(first.network.policy().is_some());
        let run = Actor::Run {
            number: 4,
            grant: &first,
        };
        let wider = run_of(&run, r#"{"code":"1","network":{"allow":["*"]}}"#).unwrap_err();
        assert_eq!(wider.code, ErrorCode::PermissionDenied);
        assert!(wider.error.contains("network.allow[0]"), "{}", wider.error);
        let narrower = run_of(
            &run,
            r#"{"code":"1","network":{"allow":["api.example.com:443"]}}"#,
        );
        assert!(narrower.unwrap().network.policy().is_some());
    }
}
