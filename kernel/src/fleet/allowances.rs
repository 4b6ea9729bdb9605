//! The fleet's ledger of THINK quotas: how much of each principal's quota
//! each window has granted, to all nodes together. A node leases a chunk
//! at a time and spends it without asking again, so THINK makes no round
//! trip to the database, and the nodes together are never granted more
//! than the quota.

use postgres::Client;

use super::error::FleetError;
use crate::permissions::allowance::{Grant, LeaseAsk};

/// Grants what `ask` wants of the current window (by the database's
/// clock), or what is left of its quota if that is less. One statement:
/// the row's lock orders nodes asking at once, and each is told its own
/// grant (`last_grant`, computed from the row before the update).
pub fn lease(client: &mut Client, ask: &LeaseAsk) -> Result<Grant, FleetError> {
    let window_secs = i64::try_from(ask.window_secs).unwrap_or(i64::MAX);
    let limit = i64::try_from(ask.limit).unwrap_or(i64::MAX);
    let amount = i64::try_from(ask.amount).unwrap_or(i64::MAX);
    let row = client.query_one(
        "WITH clock AS (
            SELECT floor(extract(epoch FROM now()) / $3::bigint)::bigint AS number
         )
         INSERT INTO agentos_allowances AS a
            (owner, measure, window_secs, window_number, granted, last_grant, ends_at)
         SELECT $1::text, $2::text, $3::bigint, number, LEAST($5::bigint, $4::bigint),
                LEAST($5::bigint, $4::bigint),
                to_timestamp((number + 1) * $3::bigint)
         FROM clock
         ON CONFLICT (owner, measure, window_secs, window_number) DO UPDATE
            SET granted = a.granted + LEAST($5::bigint, GREATEST($4::bigint - a.granted, 0)),
                last_grant = LEAST($5::bigint, GREATEST($4::bigint - a.granted, 0))
         RETURNING window_number, last_grant,
            GREATEST(extract(epoch FROM ends_at - now()) * 1000, 0)::bigint",
        &[
            &ask.owner,
            &ask.measure.as_str(),
            &window_secs,
            &limit,
            &amount,
        ],
    )?;
    let granted: i64 = row.get(1);
    let ms_left: i64 = row.get(2);
    Ok(Grant {
        window: row.get(0),
        granted: u64::try_from(granted).unwrap_or(0),
        ms_left: u64::try_from(ms_left).unwrap_or(0),
    })
}

/// Forgets windows that ended over an hour ago: nothing asks of them.
pub fn forget_old(client: &mut Client) -> Result<u64, FleetError> {
    Ok(client.execute(
        "DELETE FROM agentos_allowances WHERE ends_at < now() - interval '1 hour'",
        &[],
    )?)
}
