//! The fleet's schema, versioned: each migration is applied once, in
//! order, at a node's start, under an advisory lock so nodes starting
//! together apply it once.
//!
//! A node reads every schema version up to [`READS`]. It refuses a
//! database whose schema is newer, and migrates an older one only when
//! every live node can read the result: a fleet is upgraded node by node,
//! the database last.

use postgres::Client;

use super::error::FleetError;

/// The migrations, version 1 first. Never edit one that has shipped: add
/// the next.
const MIGRATIONS: &[&str] = &[
    // 1: nodes and their leases.
    "CREATE TABLE agentos_nodes (
        name text PRIMARY KEY,
        incarnation bigint NOT NULL,
        advertise text,
        version text NOT NULL,
        reads_schema integer NOT NULL,
        started_at timestamptz NOT NULL DEFAULT now(),
        renewed_at timestamptz NOT NULL DEFAULT now(),
        lease_until timestamptz NOT NULL,
        lease_ms integer NOT NULL,
        draining boolean NOT NULL DEFAULT false,
        agents integer NOT NULL DEFAULT 0,
        runs integer NOT NULL DEFAULT 0,
        load real NOT NULL DEFAULT 0
    )",
    // 2: tasks, claimed under fences.
    "CREATE SEQUENCE agentos_task_fences;
    CREATE TABLE agentos_tasks (
        task_id text PRIMARY KEY,
        seq bigserial NOT NULL,
        owner_user text NOT NULL,
        owner_delegate text NOT NULL,
        kind text NOT NULL,
        label text,
        dispatch json NOT NULL,
        pin text,
        max_attempts integer NOT NULL,
        attempts integer NOT NULL DEFAULT 0,
        idempotency_key text,
        dispatched_on text NOT NULL,
        state text NOT NULL,
        node text,
        incarnation bigint,
        fence bigint,
        created_at timestamptz NOT NULL DEFAULT now(),
        started_at timestamptz,
        finished_at timestamptz,
        result json
    );
    CREATE INDEX agentos_tasks_queued ON agentos_tasks (seq) WHERE state = 'queued';
    CREATE INDEX agentos_tasks_running ON agentos_tasks (node) WHERE state = 'running';
    CREATE INDEX agentos_tasks_by_owner ON agentos_tasks (owner_user, owner_delegate, seq);
    CREATE UNIQUE INDEX agentos_tasks_idempotency
        ON agentos_tasks (owner_user, owner_delegate, idempotency_key)
        WHERE idempotency_key IS NOT NULL",
    // 3: what each window of a principal's THINK quota has granted.
    "CREATE TABLE agentos_allowances (
        owner text NOT NULL,
        measure text NOT NULL,
        window_secs bigint NOT NULL,
        window_number bigint NOT NULL,
        granted bigint NOT NULL,
        last_grant bigint NOT NULL,
        ends_at timestamptz NOT NULL,
        PRIMARY KEY (owner, measure, window_secs, window_number)
    );
    CREATE INDEX agentos_allowances_ends ON agentos_allowances (ends_at)",
    // 4: hibernated sessions, and their contents once per owner.
    "CREATE SEQUENCE agentos_session_generations;
    CREATE TABLE agentos_sessions (
        owner_user text NOT NULL,
        owner_delegate text NOT NULL,
        name text NOT NULL,
        node text NOT NULL,
        generation bigint NOT NULL,
        manifest bytea NOT NULL,
        hashes text[] NOT NULL,
        bytes bigint NOT NULL,
        meta bytea NOT NULL,
        hibernated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (owner_user, owner_delegate, name)
    );
    CREATE INDEX agentos_sessions_hashes ON agentos_sessions USING gin (hashes);
    CREATE TABLE agentos_session_contents (
        owner_user text NOT NULL,
        owner_delegate text NOT NULL,
        hash text NOT NULL,
        part integer NOT NULL,
        content bytea NOT NULL,
        PRIMARY KEY (owner_user, owner_delegate, hash, part)
    );
    CREATE TABLE agentos_session_claims (
        owner_user text NOT NULL,
        owner_delegate text NOT NULL,
        name text NOT NULL,
        generation bigint NOT NULL,
        node text NOT NULL,
        claimed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (owner_user, owner_delegate, name, generation)
    )",
    // 5: where a node's MCP face is reached; the template a hibernated
    // session carries.
    "ALTER TABLE agentos_nodes ADD COLUMN advertise_mcp text;
    ALTER TABLE agentos_sessions ADD COLUMN template bytea",
];

/// The newest schema version this node reads and writes.
pub const READS: i32 = MIGRATIONS.len() as i32;

/// Any number, the same on every node: the advisory lock migrations hold.
const MIGRATION_LOCK: i64 = 0x4147_4e54_0001;

/// Brings the database's schema to [`READS`], or refuses as the module
/// says. Returns the version the database is at.
pub fn migrate(client: &mut Client) -> Result<i32, FleetError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS agentos_schema (
            one boolean PRIMARY KEY DEFAULT true CHECK (one),
            version integer NOT NULL
        );
        INSERT INTO agentos_schema (version) VALUES (0) ON CONFLICT DO NOTHING",
    )?;
    let database: i32 = tx
        .query_one("SELECT version FROM agentos_schema", &[])?
        .get(0);
    if database > READS {
        return Err(FleetError::SchemaTooNew {
            database,
            reads: READS,
        });
    }
    if database == READS {
        tx.commit()?;
        return Ok(database);
    }
    let has_nodes: bool = tx
        .query_one("SELECT to_regclass('agentos_nodes') IS NOT NULL", &[])?
        .get(0);
    if has_nodes {
        let too_old = tx.query_opt(
            "SELECT name, reads_schema FROM agentos_nodes
             WHERE lease_until > now() AND reads_schema < $1
             ORDER BY name LIMIT 1",
            &[&READS],
        )?;
        if let Some(row) = too_old {
            return Err(FleetError::NodeTooOld {
                to: READS,
                node: row.get(0),
                reads: row.get(1),
            });
        }
    }
    let applied = usize::try_from(database).map_err(|_| {
        FleetError::Unavailable(format!("the schema's version {database} is not a version"))
    })?;
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(applied) {
        tx.batch_execute(migration)?;
        log::info!("fleet: applied schema migration {}", index + 1);
    }
    tx.execute("UPDATE agentos_schema SET version = $1", &[&READS])?;
    tx.commit()?;
    Ok(READS)
}
