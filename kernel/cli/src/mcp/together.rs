//! `state` and `messages`: the state store and agents' mailboxes, each one
//! tool with an `op`, so an MCP client shares keys with the agents of its
//! tree and talks to them.

use agentos_proto::payload::{
    DeleteReply, FetchReply, KeyRequest, KeysReply, KeysRequest, RecvReply, RecvRequest, Scope,
    SendReply, SendRequest, StoreReply, StoreRequest,
};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;

use super::arguments::{ArgumentError, MessagesArguments, MessagesOp, StateArguments, StateOp};
use super::kernel::{KernelLink, Wait};
use super::results::answer;
use super::tool_error::ToolError;

fn refused(argument: &'static str, why: &'static str) -> ArgumentError {
    ArgumentError::Refused { argument, why }
}

/// `state`: the op the arguments name, answered as the kernel answers it.
pub async fn state(
    kernel: &KernelLink,
    arguments: StateArguments,
) -> Result<CallToolResult, ToolError> {
    let StateArguments {
        op,
        key,
        value,
        scope,
        ttl,
        prefix,
    } = arguments;
    let scope = scope.map(Scope::from);
    if op != StateOp::Set && (value.is_some() || ttl.is_some()) {
        return Err(refused("value", "only op set takes value and ttl").into());
    }
    if op != StateOp::List && prefix.is_some() {
        return Err(refused("prefix", "only op list takes prefix").into());
    }
    let key = match (op, key) {
        (StateOp::List, Some(_)) => return Err(refused("key", "op list takes prefix").into()),
        (StateOp::List, None) => String::new(),
        (_, key) => key.ok_or(refused("key", "ops get, set and delete need it"))?,
    };
    match op {
        StateOp::List => {
            let request = KeysRequest {
                prefix: prefix.unwrap_or_default(),
                scope,
            };
            answer::<KeysReply>(kernel, Opcode::KEYS, &request, Wait::Quick).await
        }
        StateOp::Set => {
            let request = StoreRequest {
                key,
                value: value.ok_or(refused("value", "op set needs it"))?,
                scope: scope.unwrap_or(Scope::Global),
                ttl,
            };
            answer::<StoreReply>(kernel, Opcode::STORE, &request, Wait::Quick).await
        }
        StateOp::Get => {
            let request = KeyRequest { key, scope };
            answer::<FetchReply>(kernel, Opcode::FETCH, &request, Wait::Quick).await
        }
        StateOp::Delete => {
            let request = KeyRequest { key, scope };
            answer::<DeleteReply>(kernel, Opcode::DELETE, &request, Wait::Quick).await
        }
    }
}

/// `messages`: a SEND to an agent by name or id, or a RECV.
pub async fn messages(
    kernel: &KernelLink,
    arguments: MessagesArguments,
) -> Result<CallToolResult, ToolError> {
    match arguments.op {
        MessagesOp::Send => {
            let to = arguments.to.ok_or(refused("to", "op send needs it"))?;
            let message = arguments
                .message
                .ok_or(refused("message", "op send needs it"))?;
            let (to, to_name) = match to.parse::<u32>() {
                Ok(id) => (Some(id), None),
                Err(_) => (None, Some(to)),
            };
            let request = SendRequest {
                message,
                to,
                to_name,
            };
            answer::<SendReply>(kernel, Opcode::SEND, &request, Wait::Quick).await
        }
        MessagesOp::Recv => {
            if arguments.to.is_some() || arguments.message.is_some() {
                return Err(refused("to", "op recv takes neither to nor message").into());
            }
            let request = RecvRequest::default();
            answer::<RecvReply>(kernel, Opcode::RECV, &request, Wait::Quick).await
        }
    }
}
