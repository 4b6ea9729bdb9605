//! The connection to the fleet's database: opened with bounded waits, so
//! a database that stops answering costs the fleet thread seconds, never
//! forever.

use std::time::Duration;

use postgres::{Client, NoTls};

use super::error::FleetError;
use crate::config::fleet::FleetConfig;

/// Connects to `config`'s database. Every wait is bounded: connecting by
/// `connect_timeout_ms`; an unacknowledged write (a cut link) by the TCP
/// user timeout, a third of the lease; a statement by the lease.
pub fn connect(config: &FleetConfig, node: &str) -> Result<Client, FleetError> {
    let url = config.database.as_ref().ok_or(FleetError::NotConfigured)?;
    let mut options: postgres::Config = url
        .secret()
        .parse()
        .map_err(|err: postgres::Error| FleetError::Unavailable(err.to_string()))?;
    let lease = Duration::from_millis(config.lease_ms);
    options
        .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
        .tcp_user_timeout(lease / 3)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .application_name(&format!("agentosd {node}"));
    let mut client = options.connect(NoTls)?;
    client.batch_execute(&format!(
        "SET statement_timeout = {}; SET lock_timeout = {}",
        config.lease_ms, config.lease_ms
    ))?;
    Ok(client)
}
