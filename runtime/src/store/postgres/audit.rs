//! Read-only views for `status`, `audit` and tests.

use super::*;

pub(super) async fn attempts<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    run_id: Option<&str>,
) -> Result<Vec<AttemptRow>> {
    let rows = sqlx::query(
        "SELECT * FROM attempts WHERE ($1::TEXT IS NULL OR run_id = $1) ORDER BY claim_seq",
    )
    .bind(run_id)
    .fetch_all(ex)
    .await?;
    rows.iter().map(rows::attempt_row).collect()
}

pub(super) async fn attempt<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    job_id: i64,
    attempt: i64,
) -> Result<Option<AttemptRow>> {
    sqlx::query("SELECT * FROM attempts WHERE job_id = $1 AND attempt = $2")
        .bind(job_id)
        .bind(attempt)
        .fetch_optional(ex)
        .await?
        .as_ref()
        .map(rows::attempt_row)
        .transpose()
}

pub(super) async fn outbox<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    run_id: Option<&str>,
) -> Result<Vec<OutboxRow>> {
    let rows =
        sqlx::query("SELECT * FROM outbox WHERE ($1::TEXT IS NULL OR run_id = $1) ORDER BY id")
            .bind(run_id)
            .fetch_all(ex)
            .await?;
    rows.iter().map(rows::outbox_row).collect()
}

/// Every row of one run the audit reads, from one REPEATABLE READ
/// snapshot, a page of jobs at a time.
pub(super) async fn run(
    store: &PostgresStore,
    run_id: &str,
    visitor: &mut dyn AuditVisitor,
) -> Result<()> {
    let mut tx = store
        .pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let Some(run) = sqlx::query("SELECT * FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok(());
    };
    let events = sqlx::query("SELECT * FROM run_events WHERE run_id = $1 ORDER BY id")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::run_event)
        .collect::<Result<Vec<_>>>()?;
    let digest_mismatches = artifact_metas(
        &mut tx,
        "WHERE run_id = $1 AND encode(sha256(bytes), 'hex') <> digest",
        &[run_id],
    )
    .await?;
    let orphan_artifacts = artifact_metas(
        &mut tx,
        "a WHERE run_id = $1 AND stage <> $2
           AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = a.run_id AND j.stage = a.stage)",
        &[run_id, RUN_INPUT_STAGE],
    )
    .await?;
    visitor.run(RunAuditFacts {
        run: rows::run_row(&run)?,
        events,
        digest_mismatches,
        orphan_artifacts,
    });
    let mut after = String::new();
    loop {
        let jobs = sqlx::query(
            "SELECT * FROM jobs WHERE run_id = $1 AND stage > $2 ORDER BY stage LIMIT $3",
        )
        .bind(run_id)
        .bind(&after)
        .bind(AUDIT_PAGE_JOBS)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::job_row)
        .collect::<Result<Vec<_>>>()?;
        let Some(last) = jobs.last().map(|j| j.stage.clone()) else {
            break;
        };
        let page = stage_page(&mut tx, run_id, &after, &last, jobs).await?;
        let full = page.jobs.len() as i64 == AUDIT_PAGE_JOBS;
        visitor.stages(page);
        if !full {
            break;
        }
        after = last;
    }
    tx.commit().await?;
    Ok(())
}

/// The metadata of the artifacts a `FROM artifacts ...` clause picks.
async fn artifact_metas(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    clause: &'static str,
    binds: &[&str],
) -> Result<Vec<ArtifactMeta>> {
    let sql = format!("SELECT {META_COLUMNS} FROM artifacts {clause} ORDER BY stage, output");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for value in binds {
        query = query.bind(*value);
    }
    query
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(rows::artifact_meta)
        .collect()
}

const META_COLUMNS: &str =
    "run_id, stage, output, media_type, digest, size, attempt, plugin_digest, created_at";

/// The rows of the jobs whose stages fall in `(after, last]`.
async fn stage_page(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    run_id: &str,
    after: &str,
    last: &str,
    jobs: Vec<JobRow>,
) -> Result<StageAuditPage> {
    async fn fetch<T>(
        tx: &mut sqlx::Transaction<'_, Postgres>,
        sql: &'static str,
        (run_id, after, last): (&str, &str, &str),
        map: impl Fn(&sqlx::postgres::PgRow) -> Result<T>,
    ) -> Result<Vec<T>> {
        sqlx::query(sql)
            .bind(run_id)
            .bind(after)
            .bind(last)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(map)
            .collect()
    }
    let range = (run_id, after, last);
    Ok(StageAuditPage {
        attempts: fetch(
            tx,
            "SELECT * FROM attempts WHERE run_id = $1 AND stage > $2 AND stage <= $3
             ORDER BY claim_seq",
            range,
            rows::attempt_row,
        )
        .await?,
        artifacts: artifact_metas(
            tx,
            "WHERE run_id = $1 AND stage > $2 AND stage <= $3",
            &[run_id, after, last],
        )
        .await?,
        inputs: fetch(
            tx,
            "SELECT b.*, a.digest AS source_digest FROM job_inputs b LEFT JOIN artifacts a
               ON a.run_id = b.run_id AND a.stage = b.from_stage AND a.output = b.from_output
             WHERE b.run_id = $1 AND b.stage > $2 AND b.stage <= $3",
            range,
            rows::sourced_input,
        )
        .await?,
        incoming: fetch(
            tx,
            "SELECT to_stage, COUNT(*) AS total, COUNT(*) FILTER (WHERE satisfied = 0) AS unsatisfied
             FROM edges WHERE run_id = $1 AND to_stage > $2 AND to_stage <= $3 GROUP BY to_stage",
            range,
            rows::incoming_edges,
        )
        .await?,
        early_starts: fetch(
            tx,
            "SELECT t.stage, a.attempt, a.claim_seq, e.from_stage, p.succeeded_seq
             FROM jobs t JOIN attempts a ON a.job_id = t.id
             JOIN edges e ON e.run_id = t.run_id AND e.to_stage = t.stage
             LEFT JOIN jobs p ON p.run_id = e.run_id AND p.stage = e.from_stage
             WHERE t.run_id = $1 AND t.stage > $2 AND t.stage <= $3
               AND (p.succeeded_seq IS NULL OR p.succeeded_seq >= a.claim_seq)
             ORDER BY a.claim_seq, e.from_stage",
            range,
            rows::early_start,
        )
        .await?,
        lost_edges: fetch(
            tx,
            "SELECT e.* FROM edges e JOIN jobs p ON p.run_id = e.run_id AND p.stage = e.from_stage
             WHERE e.run_id = $1 AND e.to_stage > $2 AND e.to_stage <= $3
               AND e.satisfied = 0 AND p.state = 'succeeded'
             ORDER BY e.to_stage, e.from_stage",
            range,
            |row| rows::edge_row(row).map(|(_, edge, _)| edge),
        )
        .await?,
        outbox: fetch(
            tx,
            "SELECT * FROM outbox WHERE run_id = $1 AND stage > $2 AND stage <= $3 ORDER BY id",
            range,
            rows::outbox_row,
        )
        .await?,
        jobs,
    })
}

/// Up to `limit` run ids after `after`, in id order.
pub(super) async fn run_ids(
    store: &PostgresStore,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM runs WHERE id > $1 ORDER BY id LIMIT $2")
            .bind(after.unwrap_or(""))
            .bind(limit as i64)
            .fetch_all(&store.pool)
            .await?,
    )
}
