//! The params of what the kernel sends a server, typed: `initialize`,
//! `server/discover`, `tools/list`, `tools/call`, the `_meta` a 2026-07-28
//! request carries, and `notifications/cancelled`. Fields are declared in
//! the order they go on the wire (the kernel's JSON keeps its keys' order).

use serde::Serialize;
use serde_json::Value;

/// Who the kernel is, to a server.
#[derive(Debug, Serialize)]
struct ClientInfo {
    name: &'static str,
    version: &'static str,
}

const CLIENT_INFO: ClientInfo = ClientInfo {
    name: "agentos",
    version: env!("CARGO_PKG_VERSION"),
};

/// An empty object: the client's capabilities (it has none to declare).
#[derive(Debug, Serialize)]
struct Empty {}

/// The `_meta` of a request: the protocol version, client and capabilities
/// 2026-07-28 asks of every request, and the trace context the server's
/// spans join (MCP reserves `traceparent` for it).
#[derive(Debug, Default, Serialize)]
pub struct Meta {
    #[serde(
        rename = "io.modelcontextprotocol/protocolVersion",
        skip_serializing_if = "Option::is_none"
    )]
    version: Option<&'static str>,
    #[serde(
        rename = "io.modelcontextprotocol/clientInfo",
        skip_serializing_if = "Option::is_none"
    )]
    client: Option<ClientInfo>,
    #[serde(
        rename = "io.modelcontextprotocol/clientCapabilities",
        skip_serializing_if = "Option::is_none"
    )]
    capabilities: Option<Empty>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
}

impl Meta {
    /// The `_meta` of a request in revision `version` when it is one that
    /// carries it (`Some`), else none.
    pub fn of(version: Option<&'static str>) -> Meta {
        Meta {
            version,
            client: version.map(|_| CLIENT_INFO),
            capabilities: version.map(|_| Empty {}),
            traceparent: None,
        }
    }

    /// With the trace context `traceparent`, if there is one.
    pub fn traced(self, traceparent: Option<&str>) -> Meta {
        Meta {
            traceparent: traceparent.map(str::to_owned),
            ..self
        }
    }

    fn is_empty(&self) -> bool {
        self.version.is_none() && self.traceparent.is_none()
    }
}

/// `initialize`, offering `protocol_version`.
#[derive(Debug, Serialize)]
pub struct Initialize {
    #[serde(rename = "protocolVersion")]
    protocol_version: &'static str,
    capabilities: Empty,
    #[serde(rename = "clientInfo")]
    client_info: ClientInfo,
}

impl Initialize {
    /// The handshake's params, offering `protocol_version`.
    pub fn offering(protocol_version: &'static str) -> Initialize {
        Initialize {
            protocol_version,
            capabilities: Empty {},
            client_info: CLIENT_INFO,
        }
    }
}

/// `server/discover`.
#[derive(Debug, Serialize)]
pub struct Discover {
    /// Its `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Meta::is_empty")]
    pub meta: Meta,
}

/// `tools/list`, from `cursor` (the first page without one).
#[derive(Debug, Serialize)]
pub struct List {
    /// Where the page starts (none: the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Its `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Meta::is_empty")]
    pub meta: Meta,
}

/// `tools/call`.
#[derive(Debug, Serialize)]
pub struct Call<'a> {
    /// The tool.
    pub name: &'a str,
    /// Its arguments, as the caller gave them.
    pub arguments: Value,
    /// Its `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Meta::is_empty")]
    pub meta: Meta,
}

/// `notifications/cancelled`: the request given up on, and why.
#[derive(Debug, Serialize)]
pub struct Cancelled<'a> {
    /// The request's id.
    #[serde(rename = "requestId")]
    pub request_id: u64,
    /// Why it was given up on.
    pub reason: &'a str,
}

/// An empty result: the answer to a server's `ping`.
pub fn empty() -> Value {
    Value::Object(serde_json::Map::new())
}

/// `params` as the JSON a message carries.
pub fn to_value(params: &impl Serialize) -> Value {
    serde_json::to_value(params)
        .expect("params of strings, numbers and JSON values always serialise")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const VERSION: &str = "2026-07-28";

    fn bytes(params: &impl Serialize) -> String {
        to_value(params).to_string()
    }

    fn meta() -> Value {
        json!({
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientInfo":
                {"name": "agentos", "version": env!("CARGO_PKG_VERSION")},
            "io.modelcontextprotocol/clientCapabilities": {},
        })
    }

    #[test]
    fn requests_carry_their_fields_in_wire_order_and_meta_last() {
        let initialize = Initialize::offering("2025-11-25");
        let expected = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "agentos", "version": env!("CARGO_PKG_VERSION")},
        });
        assert_eq!(bytes(&initialize), expected.to_string());
        let discover = Discover {
            meta: Meta::of(Some(VERSION)),
        };
        assert_eq!(bytes(&discover), json!({"_meta": meta()}).to_string());
        let list = List {
            cursor: Some("p2".into()),
            meta: Meta::of(Some(VERSION)),
        };
        let expected = json!({"cursor": "p2", "_meta": meta()});
        assert_eq!(bytes(&list), expected.to_string());
        let first = List {
            cursor: None,
            meta: Meta::of(None),
        };
        assert_eq!(bytes(&first), "{}");
        let cancelled = Cancelled {
            request_id: 7,
            reason: "timeout",
        };
        let expected = json!({"requestId": 7, "reason": "timeout"});
        assert_eq!(bytes(&cancelled), expected.to_string());
        assert_eq!(empty().to_string(), "{}");
    }

    #[test]
    fn a_calls_trace_context_joins_its_meta_or_is_its_meta_alone() {
        let arguments = json!({"b": 1, "a": [true]});
        let traced = Call {
            name: "echo",
            arguments: arguments.clone(),
            meta: Meta::of(Some(VERSION)).traced(Some("00-abc-def-01")),
        };
        let mut expected_meta = meta();
        expected_meta["traceparent"] = "00-abc-def-01".into();
        let expected = json!({"name": "echo", "arguments": arguments, "_meta": expected_meta});
        assert_eq!(bytes(&traced), expected.to_string());
        let handshake = Call {
            name: "echo",
            arguments: arguments.clone(),
            meta: Meta::of(None).traced(Some("00-abc-def-01")),
        };
        let expected = json!({
            "name": "echo",
            "arguments": arguments,
            "_meta": {"traceparent": "00-abc-def-01"},
        });
        assert_eq!(bytes(&handshake), expected.to_string());
        let plain = Call {
            name: "echo",
            arguments: arguments.clone(),
            meta: Meta::of(None).traced(None),
        };
        let expected = json!({"name": "echo", "arguments": arguments});
        assert_eq!(bytes(&plain), expected.to_string());
    }
}
