//! Names and mailboxes (REGISTER, SEND, RECV, BROADCAST): messages between
//! agents and operators, kept in memory.
//!
//! Every agent has a mailbox, and so does every operator or EXEC run
//! connection once it takes part in messaging (a Clove client's main
//! script is an operator connection that its workers answer by its id).
//! Mailboxes are bounded (`mailbox`): a full one refuses a SEND with
//! `busy`, and nothing here ever waits.
//!
//! Names live in one operator uid's tree. An agent's SPAWN name is
//! reserved for it; besides, each operator connection and agent may hold
//! one registered name (registering again replaces it). A name and a
//! mailbox go when their holder does: an agent when it ends for good
//! (noticed on the next call here), a connection when it closes.
//!
//! Whom a sender may reach is `reach`'s rule.

mod mailbox;
mod reach;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use agentos_proto::payload::{
    message_bytes, BroadcastReply, BroadcastRequest, Recipient, RecvReply, RecvRequest,
    RegisterReply, RegisterRequest, SendReply, SendRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::agents::{Agents, Member};
use crate::identity::FIRST_OPERATOR_ID;
use mailbox::{From, Mailbox};
pub use mailbox::{MAX_BYTES, MAX_MESSAGES};
use reach::{may_reach_agent, may_reach_connection, Endpoint};
pub use reach::{Address, Role, Sender};

/// Every name and mailbox.
#[derive(Debug, Default)]
pub struct Messages {
    /// Registered names, by tree (operator uid) and name.
    names: HashMap<(u32, String), Address>,
    /// The name each holder registered.
    name_of: HashMap<Address, String>,
    /// Connections that take part, by id.
    endpoints: BTreeMap<u32, Endpoint>,
    /// The same, by the reactor's connection serial.
    by_serial: HashMap<u64, u32>,
    /// Mailboxes with something in them, or that were read.
    mailboxes: HashMap<Address, Mailbox>,
}

impl Messages {
    /// REGISTER: `sender` takes `request.name` in its tree.
    pub fn register(
        &mut self,
        agents: &Agents,
        sender: Sender,
        request: RegisterRequest,
    ) -> Result<RegisterReply, ErrorReply> {
        self.settle(agents, sender);
        if let Role::Run { .. } = sender.role {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "an EXEC run cannot register a name: names are for agents and operators, and a \
                 run is messaged only by its caller",
            ));
        }
        let name = request.name;
        if let Some(holder) = spawn_named(agents, sender.uid, &name) {
            if Address::Agent(holder.id) != sender.address {
                return Err(ErrorReply::new(
                    ErrorCode::AlreadyExists,
                    format!("REGISTER: {name:?} is agent {}'s SPAWN name", holder.id),
                ));
            }
        }
        let key = (sender.uid, name.clone());
        match self.names.get(&key) {
            Some(holder) if *holder != sender.address => {
                return Err(ErrorReply::new(
                    ErrorCode::AlreadyExists,
                    format!("REGISTER: {name:?} is registered by {}", holder.id()),
                ));
            }
            _ => {}
        }
        let replaced = self
            .release(sender.address, sender.uid)
            .filter(|old| *old != name);
        self.names.insert(key, sender.address);
        self.name_of.insert(sender.address, name.clone());
        Ok(RegisterReply {
            success: true,
            agent_id: sender.address.id(),
            name,
            replaced,
        })
    }

    /// SEND: `request.message` into the recipient's mailbox.
    pub fn send(
        &mut self,
        agents: &Agents,
        sender: Sender,
        request: SendRequest,
    ) -> Result<SendReply, ErrorReply> {
        self.settle(agents, sender);
        let to = match request.recipient()? {
            Recipient::Id(id) => self.by_id(agents, &sender, id)?,
            Recipient::Name(name) => self.by_name(agents, &sender, &name)?,
        };
        let from = self.from(agents, &sender);
        let bytes = message_bytes(&request.message);
        self.mailboxes
            .entry(to)
            .or_default()
            .put(from, request.message, bytes, Instant::now())
            .map_err(|full| {
                ErrorReply::new(
                    ErrorCode::Busy,
                    format!(
                        "SEND: {}'s mailbox is full ({} messages, {} bytes; at most {MAX_MESSAGES} \
                         and {MAX_BYTES}); retry once it has read some",
                        to.id(),
                        full.messages,
                        full.bytes
                    ),
                )
            })?;
        Ok(SendReply {
            success: true,
            delivered_to: to.id(),
        })
    }

    /// RECV: the oldest messages in `sender`'s own mailbox.
    pub fn recv(&mut self, agents: &Agents, sender: Sender, request: &RecvRequest) -> RecvReply {
        self.settle(agents, sender);
        let (messages, remaining) = match self.mailboxes.get_mut(&sender.address) {
            Some(mailbox) => {
                let messages = mailbox.take(request.limit(), Instant::now());
                if mailbox.is_empty() {
                    self.mailboxes.remove(&sender.address);
                    (messages, 0)
                } else {
                    (messages, mailbox.len())
                }
            }
            None => (Vec::new(), 0),
        };
        RecvReply {
            success: true,
            count: messages.len(),
            messages,
            remaining,
        }
    }

    /// BROADCAST: the message into every mailbox `sender` may reach (its
    /// own too with `include_self`); a full one is skipped and counted.
    pub fn broadcast(
        &mut self,
        agents: &Agents,
        sender: Sender,
        request: BroadcastRequest,
    ) -> BroadcastReply {
        self.settle(agents, sender);
        let own = own_member(agents, &sender);
        let agents_reached = agents
            .members()
            .filter(|target| may_reach_agent(&sender, own.as_ref(), target))
            .map(|target| Address::Agent(target.id));
        let connections_reached = self
            .endpoints
            .iter()
            .filter(|(id, endpoint)| may_reach_connection(&sender, **id, endpoint))
            .map(|(id, _)| Address::Connection(*id));
        let targets: Vec<Address> = agents_reached
            .chain(connections_reached)
            .filter(|target| request.include_self || *target != sender.address)
            .collect();
        let from = self.from(agents, &sender);
        let bytes = message_bytes(&request.message);
        let now = Instant::now();
        let (mut delivered_count, mut full_count) = (0, 0);
        for target in targets {
            let mailbox = self.mailboxes.entry(target).or_default();
            match mailbox.put(from.clone(), request.message.clone(), bytes, now) {
                Ok(()) => delivered_count += 1,
                Err(_) => full_count += 1,
            }
        }
        BroadcastReply {
            success: true,
            delivered_count,
            full_count,
        }
    }

    /// A connection closed: its name and mailbox go.
    pub fn connection_closed(&mut self, serial: u64) {
        if let Some(id) = self.by_serial.remove(&serial) {
            if let Some(endpoint) = self.endpoints.remove(&id) {
                self.release(Address::Connection(id), endpoint.uid);
            }
            self.mailboxes.remove(&Address::Connection(id));
        }
    }

    /// Before every call: `sender`'s connection is known, and the names
    /// and mailboxes of agents that have ended for good are gone.
    fn settle(&mut self, agents: &Agents, sender: Sender) {
        if let (Address::Connection(id), Role::Operator { serial } | Role::Run { serial, .. }) =
            (sender.address, sender.role)
        {
            self.by_serial.insert(serial, id);
            self.endpoints.entry(id).or_insert(Endpoint {
                uid: sender.uid,
                role: sender.role,
            });
        }
        let over = |address: &Address| match address {
            Address::Agent(id) => agents.member(*id).is_none(),
            Address::Connection(_) => false,
        };
        let ended: Vec<Address> = self.name_of.keys().copied().filter(over).collect();
        for address in ended {
            if let Some(name) = self.name_of.remove(&address) {
                self.names
                    .retain(|(_, held), holder| *holder != address || *held != name);
            }
        }
        self.mailboxes.retain(|address, _| !over(address));
    }

    /// Releases `address`'s registered name, if it has one; returns it.
    fn release(&mut self, address: Address, uid: u32) -> Option<String> {
        let name = self.name_of.remove(&address)?;
        self.names.remove(&(uid, name.clone()));
        Some(name)
    }

    /// The mailbox `id` names, if `sender` may reach it.
    fn by_id(&self, agents: &Agents, sender: &Sender, id: u32) -> Result<Address, ErrorReply> {
        if id >= FIRST_OPERATOR_ID {
            return match self.endpoints.get(&id) {
                Some(endpoint) if endpoint.uid == sender.uid => {
                    if may_reach_connection(sender, id, endpoint) {
                        Ok(Address::Connection(id))
                    } else {
                        Err(unreachable(sender, id))
                    }
                }
                _ => Err(ErrorReply::new(
                    ErrorCode::NotFound,
                    format!(
                        "SEND: no connection {id} in this tree takes messages (an operator's \
                         connection has a mailbox once it has registered, sent or received)"
                    ),
                )),
            };
        }
        match agents.member(id) {
            Some(target) if target.owner_uid == sender.uid => {
                let own = own_member(agents, sender);
                if may_reach_agent(sender, own.as_ref(), &target) {
                    Ok(Address::Agent(id))
                } else {
                    Err(unreachable(sender, id))
                }
            }
            _ => Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("SEND: no live agent {id} in this tree"),
            )),
        }
    }

    /// The mailbox `name` names in `sender`'s tree, if `sender` may reach
    /// it: an agent's SPAWN name first (it is reserved for it), then a
    /// registered name.
    fn by_name(&self, agents: &Agents, sender: &Sender, name: &str) -> Result<Address, ErrorReply> {
        let found = spawn_named(agents, sender.uid, name)
            .map(|agent| Address::Agent(agent.id))
            .or_else(|| self.names.get(&(sender.uid, name.to_owned())).copied());
        match found {
            Some(address) => self.by_id(agents, sender, address.id()),
            None => Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("SEND: no agent or connection named {name:?} in this tree"),
            )),
        }
    }

    /// `sender` as its messages name it.
    fn from(&self, agents: &Agents, sender: &Sender) -> From {
        let name = self
            .name_of
            .get(&sender.address)
            .cloned()
            .or_else(|| own_member(agents, sender).map(|member| member.name.to_owned()));
        From {
            id: sender.address.id(),
            name,
            kind: sender.role.kind(),
            run_of: match sender.role {
                Role::Run { of_agent, .. } => of_agent,
                Role::Operator { .. } | Role::Agent { .. } => None,
            },
        }
    }
}

/// The agent of `uid`'s tree whose SPAWN name is `name`, if one has not
/// ended for good.
fn spawn_named<'a>(agents: &'a Agents, uid: u32, name: &str) -> Option<Member<'a>> {
    agents
        .members()
        .find(|member| member.owner_uid == uid && member.name == name)
}

/// The sender's own agent record, if it is an agent.
fn own_member<'a>(agents: &'a Agents, sender: &Sender) -> Option<Member<'a>> {
    match (sender.address, sender.role) {
        (Address::Agent(id), Role::Agent { .. }) => agents.member(id),
        _ => None,
    }
}

fn unreachable(sender: &Sender, id: u32) -> ErrorReply {
    let rule = match sender.role {
        Role::Agent { .. } => {
            "an agent messages its operator, its parent and its children, and its whole tree \
             only with `permissions.ipc`"
        }
        Role::Run { .. } => "an EXEC run messages only its caller and its operator",
        Role::Operator { .. } => "an operator messages its own tree",
    };
    ErrorReply::new(
        ErrorCode::PermissionDenied,
        format!("SEND: {} may not message {id}: {rule}", sender.address.id()),
    )
}
