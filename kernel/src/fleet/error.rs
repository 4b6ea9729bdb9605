//! What can go wrong between a node and the fleet's database.

use std::time::Duration;

use agentos_proto::{ErrorCode, ErrorReply};

/// Why a node cannot join the fleet, or why a fleet operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The database cannot be reached or stopped answering. Shown without
    /// the database's password (the client's errors never carry it).
    #[error("the fleet's database is unavailable: {0}")]
    Unavailable(String),
    /// The database's schema is newer than this node can read.
    #[error(
        "the fleet's database has schema version {database}, and this agentosd reads \
         versions up to {reads}: run an agentosd that reads version {database} or later"
    )]
    SchemaTooNew { database: i32, reads: i32 },
    /// Migrating would leave a live node unable to read the schema.
    #[error(
        "this agentosd would migrate the fleet's database to schema version {to}, but live \
         node {node:?} reads versions up to {reads}: upgrade or stop that node first"
    )]
    NodeTooOld { to: i32, node: String, reads: i32 },
    /// Another live node holds this node's name.
    #[error(
        "node name {node:?} is held by another live node (its lease has {left:?} to run): \
         give this node another [fleet] node name, or stop the other"
    )]
    NameTaken { node: String, left: Duration },
    /// This node's registration was taken over after its lease ran out.
    #[error("node {0:?} lost its registration to another node of the same name")]
    Superseded(String),
    /// Too much is asked of the fleet thread at once.
    #[error("{0}")]
    Busy(String),
    /// No such task within the caller's reach.
    #[error("you have no task {0:?} in the fleet (TASK list with \"fleet\": true names yours)")]
    NotFound(String),
    /// This node has no fleet configured.
    #[error("this node has not joined a fleet: [fleet] database is not set")]
    NotConfigured,
}

impl FleetError {
    /// Whether the error is a refusal the node must not start with (rather
    /// than a database it can wait for).
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            FleetError::Unavailable(_) | FleetError::Busy(_) | FleetError::NotFound(_)
        )
    }

    /// The error reply a caller gets.
    pub fn into_reply(self) -> ErrorReply {
        let code = match self {
            FleetError::Busy(_) => ErrorCode::Busy,
            FleetError::NotFound(_) => ErrorCode::NotFound,
            _ => ErrorCode::Unavailable,
        };
        ErrorReply::new(code, self.to_string())
    }

    /// Why the fleet is out of reach, as [`FleetError::Unavailable`] would
    /// carry it.
    pub fn reason(&self) -> String {
        match self {
            FleetError::Unavailable(why) => why.clone(),
            other => other.to_string(),
        }
    }
}

impl From<postgres::Error> for FleetError {
    /// The server's own words when it answered with an error (the client's
    /// text for those is only "db error"), else the client's, with its
    /// cause.
    fn from(err: postgres::Error) -> Self {
        let why = match (err.as_db_error(), std::error::Error::source(&err)) {
            (Some(db), _) => format!("{}: {}", db.severity(), db.message()),
            (None, Some(cause)) => format!("{err}: {cause}"),
            (None, None) => err.to_string(),
        };
        FleetError::Unavailable(why)
    }
}

impl From<FleetError> for ErrorReply {
    fn from(err: FleetError) -> Self {
        err.into_reply()
    }
}
