//! A sandbox's session as envd's services reach it: the key's tenant
//! and the session's name, each op a kernel EXEC op on that session.

use agentos_http::kernel_link::Wait;
use agentos_proto::payload::{
    ProcCall, ProcInput, ProcInputReply, ProcOutput, ProcOutputReply, ProcResize, ProcSignal,
    ProcSignalledReply, ProcStart, ProcStartedReply, ProcessInfo, ProcessesReply, Signal,
};

use super::connect::ConnectError;
use crate::tenant::Tenant;

/// The process a request names: its pid in the session, or its tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    Pid(u32),
    Tag(String),
}

/// One sandbox, reached as its tenant.
#[derive(Debug, Clone)]
pub struct Session {
    pub tenant: Tenant,
    pub id: String,
}

impl Session {
    pub async fn start(&self, mut start: ProcStart) -> Result<ProcStartedReply, ConnectError> {
        start.session = self.id.clone();
        self.op(&ProcCall::Start(Box::new(start)), Wait::Quick)
            .await
    }

    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, ConnectError> {
        let call = ProcCall::Processes {
            session: self.id.clone(),
        };
        let listed: ProcessesReply = self.op(&call, Wait::Quick).await?;
        Ok(listed.processes)
    }

    /// The process `named`: its running one, else the latest ended.
    pub async fn process(&self, named: &Named) -> Result<ProcessInfo, ConnectError> {
        let mut found: Vec<ProcessInfo> = self
            .processes()
            .await?
            .into_iter()
            .filter(|process| match named {
                Named::Pid(pid) => process.pid == *pid,
                Named::Tag(tag) => process.tag.as_ref() == Some(tag),
            })
            .collect();
        found.sort_by_key(|process| process.ended_at.is_some());
        found.into_iter().next().ok_or_else(|| {
            let which = match named {
                Named::Pid(pid) => format!("pid {pid}"),
                Named::Tag(tag) => format!("tag {tag}"),
            };
            ConnectError::new("not_found", format!("process with {which} not found"))
        })
    }

    /// Output of `pid` from `after`, waiting up to `wait_ms` for some.
    pub async fn output(
        &self,
        pid: u32,
        after: u64,
        wait_ms: u64,
    ) -> Result<ProcOutputReply, ConnectError> {
        let call = ProcCall::Output(ProcOutput {
            session: self.id.clone(),
            pid: Some(pid),
            tag: None,
            after: Some(after),
            follow: true,
            wait_ms: Some(wait_ms),
        });
        self.op(&call, Wait::AsLongAsTheKernel).await
    }

    /// Writes `data` (base64) to the process's input, closing it after
    /// with `eof`.
    pub async fn input(&self, named: &Named, data: String, eof: bool) -> Result<(), ConnectError> {
        let (pid, tag) = split(named);
        let call = ProcCall::Input(ProcInput {
            session: self.id.clone(),
            pid,
            tag,
            data,
            eof,
        });
        let _: ProcInputReply = self.op(&call, Wait::Quick).await?;
        Ok(())
    }

    pub async fn signal(&self, named: &Named, signal: Signal) -> Result<(), ConnectError> {
        let (pid, tag) = split(named);
        let call = ProcCall::Signal(ProcSignal {
            session: self.id.clone(),
            pid,
            tag,
            signal,
        });
        let _: ProcSignalledReply = self.op(&call, Wait::Quick).await?;
        Ok(())
    }

    pub async fn resize(&self, named: &Named, cols: u16, rows: u16) -> Result<(), ConnectError> {
        let (pid, tag) = split(named);
        let call = ProcCall::Resize(ProcResize {
            session: self.id.clone(),
            pid,
            tag,
            cols,
            rows,
        });
        let _: agentos_proto::payload::ProcDoneReply = self.op(&call, Wait::Quick).await?;
        Ok(())
    }

    /// An EXEC op on the session, its refusal in Connect's codes.
    pub async fn op<R: serde::de::DeserializeOwned>(
        &self,
        call: &impl serde::Serialize,
        wait: Wait,
    ) -> Result<R, ConnectError> {
        Ok(self.tenant.exec(call, wait).await?)
    }
}

/// A process's pid or tag, as a kernel op names it.
fn split(named: &Named) -> (Option<u32>, Option<String>) {
    match named {
        Named::Pid(pid) => (Some(*pid), None),
        Named::Tag(tag) => (None, Some(tag.clone())),
    }
}
