//! The statements of a host attempt (`store::host`) and of a map
//! (`store::map`) on the writer's transaction. Each statement is a call of
//! its own and binds one JSON document (`?1`) where it needs several
//! values: sqlx binds numbered parameters that a statement of a
//! multi-statement query skips to the wrong values.

use super::*;
use crate::store::complete::Success;
use crate::store::host::{self, HostTx};
use crate::store::map::{MapJob, MapTx, StoredBytes};

impl HostTx for complete::Completion<'_, '_> {
    async fn job_take(&mut self, job_id: i64, attempt: i64, worker: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE jobs SET state = 'running', attempt = ?, lease_owner = ?,
                    lease_expires_at = ?, updated_at = ?
             WHERE id = ?",
        )
        .bind(attempt)
        .bind(worker)
        .bind(now)
        .bind(now)
        .bind(job_id)
        .execute(&mut **self.0)
        .await?;
        sqlx::query("UPDATE counters SET value = value + 1 WHERE name = 'seq'")
            .execute(&mut **self.0)
            .await?;
        sqlx::query(
            "INSERT INTO attempts (job_id, attempt, run_id, stage, worker, plugin_digest,
                                   claim_seq, claimed_at, outcome)
             SELECT id, attempt, run_id, stage, lease_owner, NULL,
                    (SELECT value FROM counters WHERE name = 'seq'), updated_at, 'running'
             FROM jobs WHERE id = ?",
        )
        .bind(job_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn artifact_put(&mut self, put: ArtifactPut<'_>) -> Result<CanonicalArtifact> {
        crate::store::canonical::put(&mut artifacts::Canonical(self.0), put).await
    }

    async fn job_succeed(
        &mut self,
        s: &Success<'_>,
        run_id: &str,
    ) -> Result<Vec<(String, String)>> {
        host::succeed(self, s, run_id).await
    }

    async fn job_kill(&mut self, f: &JobFail, run_id: &str) -> Result<()> {
        host::kill(&mut fail::Failing(self.0), f, run_id).await
    }
}

/// The element indexes `0..$.n` of the document `?1`.
const ELEMENTS: &str = "WITH RECURSIVE element (i) AS (
         SELECT 0 WHERE (?1 ->> '$.n') > 0
         UNION ALL SELECT i + 1 FROM element WHERE i + 1 < (?1 ->> '$.n'))";

impl MapTx for complete::Completion<'_, '_> {
    async fn map_jobs(&mut self, keys: &[(String, String)]) -> Result<Vec<MapJob>> {
        let rows = sqlx::query(
            "SELECT j.id, j.run_id, j.stage, j.attempt, j.map_stage,
                    j.map_output, j.map_cap, j.map_count, j.outputs
             FROM json_each(?) AS k CROSS JOIN jobs j
               ON j.run_id = k.value ->> 0 AND j.stage = k.value ->> 1
             WHERE j.state = 'mapping'
             ORDER BY j.id",
        )
        .bind(to_json(&keys))
        .fetch_all(&mut **self.0)
        .await?;
        rows.iter().map(MapJob::from_row).collect()
    }

    async fn artifact_bytes(
        &mut self,
        run: &str,
        stage: &str,
        output: &str,
    ) -> Result<Option<StoredBytes>> {
        let row = sqlx::query(
            "SELECT bytes, media_type, attempt, plugin_digest FROM artifacts
             WHERE run_id = ? AND stage = ? AND output = ?",
        )
        .bind(run)
        .bind(stage)
        .bind(output)
        .fetch_optional(&mut **self.0)
        .await?;
        row.as_ref().map(StoredBytes::from_row).transpose()
    }

    async fn elements_create(
        &mut self,
        m: &MapJob,
        elements: &[ArtifactPut<'_>],
        now: i64,
    ) -> Result<()> {
        self.artifacts_insert(elements).await?;
        let doc = serde_json::json!({
            "run": m.run_id, "stage": m.stage, "job": m.job_id, "from": m.source.0,
            "output": m.source.1, "n": elements.len(), "now": now,
        })
        .to_string();
        let statements = [
            format!(
                "{ELEMENTS}
                 INSERT INTO jobs (run_id, stage, plugin_digest, outputs, emits, state, pending,
                                   max_attempts, next_run_at, created_at, updated_at)
                 SELECT m.run_id, m.stage || '[' || e.i || ']', m.plugin_digest, m.outputs,
                        m.emits, 'ready', 0, m.max_attempts, ?1 ->> '$.now', ?1 ->> '$.now',
                        ?1 ->> '$.now'
                 FROM element e CROSS JOIN jobs m WHERE m.id = ?1 ->> '$.job' ORDER BY e.i"
            ),
            format!(
                "{ELEMENTS}
                 INSERT INTO job_inputs (run_id, stage, input, from_stage, from_output)
                 SELECT b.run_id, b.stage || '[' || e.i || ']', b.input, b.from_stage,
                        CASE WHEN b.from_stage = ?1 ->> '$.from'
                              AND b.from_output = ?1 ->> '$.output'
                             THEN b.from_output || '[' || e.i || ']' ELSE b.from_output END
                 FROM element e CROSS JOIN job_inputs b
                 WHERE b.run_id = ?1 ->> '$.run' AND b.stage = ?1 ->> '$.stage'"
            ),
            format!(
                "{ELEMENTS}
                 INSERT INTO edges (run_id, from_stage, to_stage, kind, satisfied)
                 SELECT ?1 ->> '$.run', ?1 ->> '$.from', ?1 ->> '$.stage' || '[' || e.i || ']',
                        'data', 1 FROM element e
                 UNION ALL
                 SELECT ?1 ->> '$.run', ?1 ->> '$.stage' || '[' || e.i || ']', ?1 ->> '$.stage',
                        'data', 0 FROM element e"
            ),
            "UPDATE jobs SET map_count = ?1 ->> '$.n', pending = ?1 ->> '$.n',
                    state = CASE WHEN (?1 ->> '$.n') > 0 THEN 'blocked' ELSE state END,
                    updated_at = ?1 ->> '$.now'
             WHERE id = ?1 ->> '$.job'"
                .to_string(),
            "UPDATE runs SET unfinished = unfinished + (?1 ->> '$.n') WHERE id = ?1 ->> '$.run'"
                .to_string(),
        ];
        for sql in statements {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(&doc)
                .execute(&mut **self.0)
                .await?;
        }
        Ok(())
    }

    async fn element_outputs(&mut self, m: &MapJob, output: &str) -> Result<Vec<StoredBytes>> {
        let doc = serde_json::json!({ "n": m.count.unwrap_or(0) }).to_string();
        let sql = format!(
            "{ELEMENTS}
             SELECT a.bytes, a.media_type, a.attempt, a.plugin_digest
             FROM element e CROSS JOIN artifacts a
               ON a.run_id = ?2 AND a.stage = ?3 || '[' || e.i || ']' AND a.output = ?4
             ORDER BY e.i"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(doc)
            .bind(&m.run_id)
            .bind(&m.stage)
            .bind(output)
            .fetch_all(&mut **self.0)
            .await?;
        rows.iter().map(StoredBytes::from_row).collect()
    }
}
