//! Keeping the job queue's indexes clear of dead entries (ADR 0019).

use super::*;

/// A vacuum is due once `jobs` holds at least this many dead row versions,
/// and at least a fifth as many as live ones (so a vacuum's cost, which
/// grows with the table, stays a small share of the work that made them).
const DUE_AT_DEAD: i64 = 10_000;

/// Vacuums `jobs` when it is due, skipping it if another session holds the
/// table (another worker vacuuming it). The counts are the statistics the
/// server keeps, at most a second or so behind. A role that may not vacuum
/// the table is told so instead: PostgreSQL would skip the table with a
/// warning and report success.
pub(super) async fn jobs(store: &PostgresStore) -> Result<JobsVacuum> {
    let counts: Option<(i64, i64)> = sqlx::query_as(
        "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass",
    )
    .fetch_optional(&store.pool)
    .await?;
    let Some((live, dead)) = counts else {
        return Ok(JobsVacuum::NotDue);
    };
    if dead < DUE_AT_DEAD.max(live / 5) {
        return Ok(JobsVacuum::NotDue);
    }
    // Who may vacuum (PostgreSQL 15 and 16; 17 adds the MAINTAIN
    // privilege, asked only where it exists).
    let (permitted, role): (bool, String) = sqlx::query_as(
        "SELECT r.rolsuper OR pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE')
                OR CASE WHEN current_setting('server_version_num')::int >= 170000
                        THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END,
                current_user::text
         FROM pg_class c, pg_database d, pg_roles r
         WHERE c.oid = 'jobs'::regclass AND d.datname = current_database()
           AND r.rolname = current_user",
    )
    .fetch_one(&store.pool)
    .await?;
    if !permitted {
        return Ok(JobsVacuum::NotPermitted(format!(
            "the role `{role}` does not own the `jobs` table (nor the database), so PostgreSQL will not let it vacuum the table; the queue is left to autovacuum (ADR 0019)"
        )));
    }
    // The simple query protocol: VACUUM cannot run in a transaction block.
    sqlx::raw_sql("VACUUM (SKIP_LOCKED) jobs")
        .execute(&store.pool)
        .await?;
    Ok(JobsVacuum::Vacuumed)
}

impl PostgresStore {
    /// Has each of this store's open connections send its pending
    /// statistics to the server now (`pg_stat_force_next_flush`; an idle
    /// connection sends them within about ten seconds otherwise), so that
    /// [`Queue::jobs_vacuum`] sees all the work done through this store.
    /// For tests and diagnostics.
    pub async fn statistics_flush(&self) -> Result<()> {
        let mut held = Vec::new();
        for _ in 0..self.pool.size() {
            held.push(self.pool.acquire().await?);
        }
        for conn in &mut held {
            // Sent as the connection goes idle after this statement, before
            // the server answers it.
            sqlx::query("SELECT pg_stat_force_next_flush()")
                .execute(&mut **conn)
                .await?;
        }
        Ok(())
    }
}
