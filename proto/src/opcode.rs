//! Opcodes: the one-byte operation selector in every frame header.

use std::fmt;

/// A frame's opcode.
///
/// This is a newtype over the raw byte rather than a closed enum because the
/// protocol must carry opcodes it does not know: an unknown opcode is answered
/// with an `unknown_opcode` error under the *same* opcode, and later kernels
/// add opcodes without breaking older clients.
///
/// ```
/// use agentos_proto::Opcode;
/// assert_eq!(Opcode::from(0xFE), Opcode::HELLO);
/// assert_eq!(Opcode::HELLO.name(), Some("HELLO"));
/// assert!(!Opcode::from(0x42).is_known());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

impl Opcode {
    /// Echo: the reply carries the request's bytes unchanged.
    pub const NOOP: Opcode = Opcode(0x00);
    /// Ask the shared LLM.
    pub const THINK: Opcode = Opcode(0x01);
    /// Run code in a pooled sandbox.
    pub const EXEC: Opcode = Opcode(0x02);
    /// Read a file in the caller's own view.
    pub const READ: Opcode = Opcode(0x03);
    /// Write a file in the caller's own view.
    pub const WRITE: Opcode = Opcode(0x04);
    /// List, search and call tools (MCP servers' and the kernel's).
    pub const TOOL: Opcode = Opcode(0x05);
    /// The caller's own permissions, with the level they amount to.
    pub const GET_PERMS: Opcode = Opcode(0x40);
    /// Lower the caller's permissions, or an agent's it manages.
    pub const SET_PERMS: Opcode = Opcode(0x41);
    /// Make an HTTP request under the caller's network policy.
    pub const HTTP: Opcode = Opcode(0x50);
    /// Start recording calls.
    pub const RECORD_START: Opcode = Opcode(0x70);
    /// Stop recording.
    pub const RECORD_STOP: Opcode = Opcode(0x71);
    /// Whether recording, and the recording.
    pub const RECORD_STATUS: Opcode = Opcode(0x72);
    /// Replay a recording.
    pub const REPLAY_START: Opcode = Opcode(0x73);
    /// How the last replay went.
    pub const REPLAY_STATUS: Opcode = Opcode(0x74);
    /// The results of asynchronous requests that are done.
    pub const ASYNC_POLL: Opcode = Opcode(0x80);
    /// Start an agent process.
    pub const SPAWN: Opcode = Opcode(0x10);
    /// Stop an agent process tree.
    pub const KILL: Opcode = Opcode(0x11);
    /// List known agents.
    pub const LIST: Opcode = Opcode(0x12);
    /// Background work: dispatch, status, wait, list, cancel.
    pub const TASK: Opcode = Opcode(0x13);
    /// Freeze an agent's processes where they stand.
    pub const PAUSE: Opcode = Opcode(0x14);
    /// Let a paused agent go on.
    pub const RESUME: Opcode = Opcode(0x15);
    /// An agent's log: its tail, or what it writes next.
    pub const LOGS: Opcode = Opcode(0x16);
    /// An agent's network: its connection record, or a new policy.
    pub const NET: Opcode = Opcode(0x17);
    /// The kernel's metrics, in the Prometheus text format.
    pub const METRICS: Opcode = Opcode(0x18);
    /// Narrow an operator's connection to a delegate principal it names.
    pub const DELEGATE: Opcode = Opcode(0x19);
    /// The fleet this node has joined: its nodes.
    pub const FLEET: Opcode = Opcode(0x1A);
    /// Send a message to an agent's (or an operator's) mailbox.
    pub const SEND: Opcode = Opcode(0x20);
    /// Take messages from the caller's own mailbox.
    pub const RECV: Opcode = Opcode(0x21);
    /// Send a message to every mailbox the caller may message.
    pub const BROADCAST: Opcode = Opcode(0x22);
    /// Register a name to be messaged by.
    pub const REGISTER: Opcode = Opcode(0x23);
    /// Store a key's JSON value in the state store.
    pub const STORE: Opcode = Opcode(0x30);
    /// Fetch a key's value from the state store.
    pub const FETCH: Opcode = Opcode(0x31);
    /// Delete a key from the state store.
    pub const DELETE: Opcode = Opcode(0x32);
    /// List the state store's keys the caller sees.
    pub const KEYS: Opcode = Opcode(0x33);
    /// Entries of the audit log the caller may read.
    pub const GET_AUDIT_LOG: Opcode = Opcode(0x76);
    /// Which categories the audit log records, and how many entries it
    /// keeps (operators).
    pub const SET_AUDIT_CONFIG: Opcode = Opcode(0x77);
    /// Subscribe the connection to event types.
    pub const SUBSCRIBE: Opcode = Opcode(0x60);
    /// End the connection's subscriptions to event types.
    pub const UNSUBSCRIBE: Opcode = Opcode(0x61);
    /// Take the events queued for the connection.
    pub const POLL: Opcode = Opcode(0x62);
    /// Make a CUSTOM event for the subscribers that may see the caller.
    pub const EMIT: Opcode = Opcode(0x63);
    /// The host's CPU, memory, disk and network (operators).
    pub const SYSTEM_METRICS: Opcode = Opcode(0xC0);
    /// One agent's process and cgroup figures.
    pub const AGENT_METRICS: Opcode = Opcode(0xC1);
    /// Every visible agent's process and cgroup figures.
    pub const ALL_AGENT_METRICS: Opcode = Opcode(0xC2);
    /// One agent's cgroup figures.
    pub const CGROUP_METRICS: Opcode = Opcode(0xC3);
    /// Protocol and feature discovery.
    pub const HELLO: Opcode = Opcode(0xFE);
    /// Say goodbye and close the connection. Also the opcode of a `bad_magic`
    /// error reply, since a frame with wrong magic has no trustworthy opcode.
    pub const EXIT: Opcode = Opcode(0xFF);

    /// Every opcode defined by the protocol, in table order.
    pub const ALL: [Opcode; 46] = [
        Opcode::NOOP,
        Opcode::THINK,
        Opcode::EXEC,
        Opcode::READ,
        Opcode::WRITE,
        Opcode::TOOL,
        Opcode::SPAWN,
        Opcode::KILL,
        Opcode::LIST,
        Opcode::TASK,
        Opcode::PAUSE,
        Opcode::RESUME,
        Opcode::LOGS,
        Opcode::NET,
        Opcode::METRICS,
        Opcode::DELEGATE,
        Opcode::FLEET,
        Opcode::SEND,
        Opcode::RECV,
        Opcode::BROADCAST,
        Opcode::REGISTER,
        Opcode::STORE,
        Opcode::FETCH,
        Opcode::DELETE,
        Opcode::KEYS,
        Opcode::GET_PERMS,
        Opcode::SET_PERMS,
        Opcode::HTTP,
        Opcode::RECORD_START,
        Opcode::RECORD_STOP,
        Opcode::RECORD_STATUS,
        Opcode::REPLAY_START,
        Opcode::REPLAY_STATUS,
        Opcode::ASYNC_POLL,
        Opcode::GET_AUDIT_LOG,
        Opcode::SET_AUDIT_CONFIG,
        Opcode::SUBSCRIBE,
        Opcode::UNSUBSCRIBE,
        Opcode::POLL,
        Opcode::EMIT,
        Opcode::SYSTEM_METRICS,
        Opcode::AGENT_METRICS,
        Opcode::ALL_AGENT_METRICS,
        Opcode::CGROUP_METRICS,
        Opcode::HELLO,
        Opcode::EXIT,
    ];

    /// The protocol name of a known opcode (`"NOOP"`, `"THINK"`, ...).
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Opcode::NOOP => "NOOP",
            Opcode::THINK => "THINK",
            Opcode::EXEC => "EXEC",
            Opcode::READ => "READ",
            Opcode::WRITE => "WRITE",
            Opcode::TOOL => "TOOL",
            Opcode::SPAWN => "SPAWN",
            Opcode::KILL => "KILL",
            Opcode::LIST => "LIST",
            Opcode::TASK => "TASK",
            Opcode::PAUSE => "PAUSE",
            Opcode::RESUME => "RESUME",
            Opcode::LOGS => "LOGS",
            Opcode::NET => "NET",
            Opcode::METRICS => "METRICS",
            Opcode::DELEGATE => "DELEGATE",
            Opcode::FLEET => "FLEET",
            Opcode::SEND => "SEND",
            Opcode::RECV => "RECV",
            Opcode::BROADCAST => "BROADCAST",
            Opcode::REGISTER => "REGISTER",
            Opcode::STORE => "STORE",
            Opcode::FETCH => "FETCH",
            Opcode::DELETE => "DELETE",
            Opcode::KEYS => "KEYS",
            Opcode::GET_PERMS => "GET_PERMS",
            Opcode::SET_PERMS => "SET_PERMS",
            Opcode::HTTP => "HTTP",
            Opcode::RECORD_START => "RECORD_START",
            Opcode::RECORD_STOP => "RECORD_STOP",
            Opcode::RECORD_STATUS => "RECORD_STATUS",
            Opcode::REPLAY_START => "REPLAY_START",
            Opcode::REPLAY_STATUS => "REPLAY_STATUS",
            Opcode::ASYNC_POLL => "ASYNC_POLL",
            Opcode::GET_AUDIT_LOG => "GET_AUDIT_LOG",
            Opcode::SET_AUDIT_CONFIG => "SET_AUDIT_CONFIG",
            Opcode::SUBSCRIBE => "SUBSCRIBE",
            Opcode::UNSUBSCRIBE => "UNSUBSCRIBE",
            Opcode::POLL => "POLL",
            Opcode::EMIT => "EMIT",
            Opcode::SYSTEM_METRICS => "SYSTEM_METRICS",
            Opcode::AGENT_METRICS => "AGENT_METRICS",
            Opcode::ALL_AGENT_METRICS => "ALL_AGENT_METRICS",
            Opcode::CGROUP_METRICS => "CGROUP_METRICS",
            Opcode::HELLO => "HELLO",
            Opcode::EXIT => "EXIT",
            _ => return None,
        })
    }

    /// Whether the protocol defines this opcode.
    pub fn is_known(self) -> bool {
        self.name().is_some()
    }

    /// Looks an opcode up by its protocol name, ignoring ASCII case.
    pub fn from_name(name: &str) -> Option<Opcode> {
        Opcode::ALL
            .into_iter()
            .find(|op| op.name().is_some_and(|n| n.eq_ignore_ascii_case(name)))
    }
}

impl From<u8> for Opcode {
    fn from(byte: u8) -> Self {
        Opcode(byte)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> Self {
        op.0
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "0x{:02X}", self.0),
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opcode({self}=0x{:02X})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_opcode_has_its_table_value_and_name() {
        let table = [
            (0x00, "NOOP"),
            (0x01, "THINK"),
            (0x02, "EXEC"),
            (0x03, "READ"),
            (0x04, "WRITE"),
            (0x05, "TOOL"),
            (0x10, "SPAWN"),
            (0x11, "KILL"),
            (0x12, "LIST"),
            (0x13, "TASK"),
            (0x14, "PAUSE"),
            (0x15, "RESUME"),
            (0x16, "LOGS"),
            (0x17, "NET"),
            (0x18, "METRICS"),
            (0x19, "DELEGATE"),
            (0x1A, "FLEET"),
            (0x20, "SEND"),
            (0x21, "RECV"),
            (0x22, "BROADCAST"),
            (0x23, "REGISTER"),
            (0x30, "STORE"),
            (0x31, "FETCH"),
            (0x32, "DELETE"),
            (0x33, "KEYS"),
            (0x40, "GET_PERMS"),
            (0x41, "SET_PERMS"),
            (0x50, "HTTP"),
            (0x70, "RECORD_START"),
            (0x71, "RECORD_STOP"),
            (0x72, "RECORD_STATUS"),
            (0x73, "REPLAY_START"),
            (0x74, "REPLAY_STATUS"),
            (0x80, "ASYNC_POLL"),
            (0x76, "GET_AUDIT_LOG"),
            (0x77, "SET_AUDIT_CONFIG"),
            (0x60, "SUBSCRIBE"),
            (0x61, "UNSUBSCRIBE"),
            (0x62, "POLL"),
            (0x63, "EMIT"),
            (0xC0, "SYSTEM_METRICS"),
            (0xC1, "AGENT_METRICS"),
            (0xC2, "ALL_AGENT_METRICS"),
            (0xC3, "CGROUP_METRICS"),
            (0xFE, "HELLO"),
            (0xFF, "EXIT"),
        ];
        for (byte, name) in table {
            let op = Opcode::from(byte);
            assert_eq!(op.name(), Some(name));
            assert_eq!(Opcode::from_name(name), Some(op));
            assert_eq!(Opcode::from_name(&name.to_lowercase()), Some(op));
        }
        assert_eq!(Opcode::ALL.len(), table.len());
    }

    #[test]
    fn unknown_opcodes_display_as_hex() {
        assert_eq!(Opcode(0x42).to_string(), "0x42");
        assert!(!Opcode(0x06).is_known());
        assert_eq!(Opcode::from_name("FLY"), None);
    }
}
