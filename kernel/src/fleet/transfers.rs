//! Hibernated sessions move to and from the fleet's store on a thread and
//! a connection of their own: a session's contents may take seconds to
//! send, and the fleet thread must renew the node's lease meanwhile. Jobs
//! are done one at a time, in order; each answer goes to the kernel as a
//! [`FleetEvent::Session`], with a wake.

use std::sync::mpsc::Receiver;
use std::time::Duration;

use agentos_primitives::pool::Outbox;
use postgres::Client;

use super::database;
use super::error::FleetError;
use super::member::FleetEvent;
use super::sessions::SessionJob;
use crate::config::fleet::FleetConfig;

/// How long one statement of a transfer may take.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a transfer waits for an owner's lock, which another node's
/// publication of a large session may hold meanwhile.
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Does `jobs` until the kernel drops its end, connecting when a job comes
/// and the last connection is gone.
pub fn serve(
    config: &FleetConfig,
    node: &str,
    jobs: Receiver<SessionJob>,
    events: Outbox<FleetEvent>,
) {
    let mut client: Option<Client> = None;
    for job in jobs {
        if client.as_ref().is_some_and(Client::is_closed) {
            client = None;
        }
        if client.is_none() {
            match connect(config, node) {
                Ok(connected) => client = Some(connected),
                Err(err) => {
                    let news = job.run(Err(err), node);
                    if events.send(FleetEvent::Session(news)).is_err() {
                        return;
                    }
                    continue;
                }
            }
        }
        let connected = client
            .as_mut()
            .ok_or_else(|| FleetError::Unavailable("not connected".into()));
        let news = job.run(connected, node);
        if events.send(FleetEvent::Session(news)).is_err() {
            return;
        }
    }
}

fn connect(config: &FleetConfig, node: &str) -> Result<Client, FleetError> {
    let mut client = database::connect(config, node)?;
    let (statement, lock) = (STATEMENT_TIMEOUT.as_millis(), LOCK_TIMEOUT.as_millis());
    client.batch_execute(&format!(
        "SET statement_timeout = {statement}; SET lock_timeout = {lock}"
    ))?;
    Ok(client)
}
