//! Kernel replies as the kernel sent them: what `--json` prints.
//!
//! The commands read every reply through the protocol's types; `--json`
//! promises the kernel's own words, fields the CLI has no type for
//! included. This is the one place that holds JSON unread. (A tool call's
//! arguments and result, which are the tool's, are `call`'s.)

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentos_proto::payload::ExecCall;
use agentos_proto::{Client, ClientError, ErrorCode, Opcode};

use crate::error::CliError;
use crate::format::print_json;

/// Asks the kernel for EXEC operation `call`; its reply as sent. A
/// `not_found` refusal is said in the CLI's words by `named`, given the
/// kernel's message, when the operation names what was not found.
pub fn ask_exec(
    client: &mut Client,
    call: &ExecCall,
    named: Option<impl FnOnce(String) -> CliError>,
) -> Result<Raw, CliError> {
    ask(client, Opcode::EXEC, call, named)
}

/// Sends `request` under `opcode`; the reply as sent, a `not_found`
/// refusal said by `named` as for [`ask_exec`].
pub fn ask(
    client: &mut Client,
    opcode: Opcode,
    request: &impl Serialize,
    named: Option<impl FnOnce(String) -> CliError>,
) -> Result<Raw, CliError> {
    client
        .call_json(opcode, &serde_json::to_vec(request)?)
        .map_err(|err| match (err, named) {
            (ClientError::Remote(reply), Some(named)) if reply.code == ErrorCode::NotFound => {
                named(reply.error)
            }
            (err, _) => err.into(),
        })
}

/// A reply, or a part of one, as the kernel sent it.
///
/// It deserialises from any JSON, so a reply type of the CLI's own can
/// keep one of its fields as sent (`struct Waited { task: Raw }`), and a
/// reply read with `Client::call_json` stays whole.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Raw(Value);

impl Raw {
    /// A reply's payload, whatever it says (a refusal included).
    pub fn parse(payload: &[u8]) -> Result<Raw, CliError> {
        Ok(Raw(serde_json::from_slice(payload)?))
    }

    /// The reply read as the protocol's `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, CliError> {
        T::deserialize(&self.0).map_err(|err| CliError::Kernel(ClientError::Json(err)))
    }

    /// Whether the reply says `"success": true` (anything else, its
    /// absence included, is a failure).
    pub fn succeeded(&self) -> bool {
        self.0.get("success") == Some(&Value::Bool(true))
    }

    /// Prints it as `--json` does.
    pub fn print(&self) -> Result<(), CliError> {
        print_json(&self.0)
    }
}
