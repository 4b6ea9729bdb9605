//! One key's view of the kernel: its sandboxes are its delegate's
//! sessions, and every call goes through a connection narrowed to that
//! delegate, so the kernel itself keeps one key from another's.

use agentos_http::kernel_link::{KernelError, KernelLink, Wait};
use agentos_proto::payload::{
    ClosedReply, DelegateName, ExecCall, Lifetime, LifetimeReply, PauseRequest, SessionInfo,
    SessionOpen, SessionOpenedReply, SessionPauseReply, SessionsReply,
};
use agentos_proto::Opcode;

use crate::answer::ApiError;

/// The label that marks a session as a sandbox of this face's, holding
/// the template its creator named.
pub const TEMPLATE_LABEL: &str = "e2b.template";
/// The label holding what becomes of a sandbox at its timeout, as its
/// creator asked (`kill` or `pause`): a woken session has no lifetime
/// until one is set, and this says which to set.
pub const ON_TIMEOUT_LABEL: &str = "e2b.on-timeout";
/// The label holding when the sandbox was made, to the millisecond (the
/// session's own record has whole seconds; E2B lists and orders by it).
pub const STARTED_LABEL: &str = "e2b.started";
/// The label holding a create's idempotency key and its body's hash.
pub const IDEMPOTENCY_LABEL: &str = "e2b.idempotency";
/// Labels of the face's own start with this; metadata may not.
pub const OWN_LABEL_PREFIX: &str = "e2b.";

/// A key's delegate, and the kernel narrowed to it.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub delegate: DelegateName,
    link: KernelLink,
}

impl Tenant {
    pub fn new(kernel: &KernelLink, delegate: DelegateName) -> Tenant {
        Tenant {
            delegate,
            link: kernel.for_delegate(delegate),
        }
    }

    /// The tenant's sandboxes: its sessions this face opened.
    pub async fn sandboxes(&self) -> Result<Vec<SessionInfo>, ApiError> {
        self.listed(false).await
    }

    /// The tenant's sandboxes, each with what it uses now (read from its
    /// cgroup: asked for only where it is shown).
    pub async fn sandboxes_with_usage(&self) -> Result<Vec<SessionInfo>, ApiError> {
        self.listed(true).await
    }

    async fn listed(&self, usage: bool) -> Result<Vec<SessionInfo>, ApiError> {
        let call = ExecCall::Sessions { usage };
        let listed: SessionsReply = self.exec(&call, Wait::Quick).await?;
        Ok(listed
            .sessions
            .into_iter()
            .filter(|session| session.labels.contains_key(TEMPLATE_LABEL))
            .collect())
    }

    /// The sandbox `id`, or E2B's not-found.
    pub async fn sandbox(&self, id: &str) -> Result<SessionInfo, ApiError> {
        self.sandboxes()
            .await?
            .into_iter()
            .find(|session| session.session == id)
            .ok_or_else(|| ApiError::not_found(id))
    }

    /// Opens a session; it may take as long as its template's disk does.
    pub async fn open(&self, open: SessionOpen) -> Result<SessionOpenedReply, ApiError> {
        let call = ExecCall::Open(Box::new(open));
        self.exec(&call, Wait::AsLongAsTheKernel).await
    }

    /// Closes the sandbox `id`: false if there was none.
    pub async fn close(&self, id: &str) -> Result<bool, ApiError> {
        let call = ExecCall::Close {
            session: id.to_owned(),
        };
        let closed: ClosedReply = self.exec(&call, Wait::Quick).await?;
        Ok(closed.closed)
    }

    /// Sets the sandbox's lifetime from now.
    pub async fn set_lifetime(&self, id: &str, lifetime: Lifetime) -> Result<(), ApiError> {
        let call = ExecCall::Lifetime {
            session: id.to_owned(),
            lifetime: Some(lifetime),
        };
        let _: LifetimeReply = self.exec(&call, Wait::Quick).await?;
        Ok(())
    }

    /// Freezes the sandbox, or hibernates it.
    pub async fn pause(&self, id: &str, hibernate: bool) -> Result<(), ApiError> {
        let request = PauseRequest {
            session: Some(id.to_owned()),
            hibernate,
            ..PauseRequest::default()
        };
        let _: SessionPauseReply = self.call(Opcode::PAUSE, &request, Wait::Quick).await?;
        Ok(())
    }

    /// Thaws or wakes the sandbox.
    pub async fn resume(&self, id: &str) -> Result<(), ApiError> {
        let request = PauseRequest {
            session: Some(id.to_owned()),
            ..PauseRequest::default()
        };
        let _: SessionPauseReply = self
            .call(Opcode::RESUME, &request, Wait::AsLongAsTheKernel)
            .await?;
        Ok(())
    }

    /// An EXEC op of the tenant's (a session's processes and files
    /// carry their own `op`), read as `R`.
    pub async fn exec<R: serde::de::DeserializeOwned>(
        &self,
        call: &impl serde::Serialize,
        wait: Wait,
    ) -> Result<R, ApiError> {
        self.call(Opcode::EXEC, call, wait).await
    }

    async fn call<R: serde::de::DeserializeOwned>(
        &self,
        opcode: Opcode,
        body: &impl serde::Serialize,
        wait: Wait,
    ) -> Result<R, ApiError> {
        self.link
            .request(opcode, body, wait)
            .await
            .map_err(|err: KernelError| ApiError::from_kernel(&err))
    }
}
