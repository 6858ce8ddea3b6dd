//! The statements of a host attempt (`store::host`) and of a map
//! (`store::map`) on a write transaction, rows locked as those modules
//! say.

use super::*;
use crate::store::complete::Success;
use crate::store::host::{self, HostTx};
use crate::store::map::{MapJob, MapTx, StoredBytes};

impl HostTx for complete::Completion<'_> {
    async fn job_take(&mut self, job_id: i64, attempt: i64, worker: &str, now: i64) -> Result<()> {
        sqlx::query(
            "WITH taken AS (
                 UPDATE jobs SET state = 'running', attempt = $2, lease_owner = $3,
                        lease_expires_at = $4, updated_at = $4
                 WHERE id = $1
                 RETURNING id, attempt, run_id, stage
             )
             INSERT INTO attempts (job_id, attempt, run_id, stage, worker, plugin_digest,
                                   claim_seq, claimed_at, outcome, deps_seen)
             SELECT t.id, t.attempt, t.run_id, t.stage, $3, NULL, nextval('ratchet_seq'), $4,
                    'running',
                    (SELECT COUNT(*) FROM edges e
                     WHERE e.run_id = t.run_id AND e.to_stage = t.stage AND e.satisfied = 1)
             FROM taken t",
        )
        .bind(job_id)
        .bind(attempt)
        .bind(worker)
        .bind(now)
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

impl MapTx for complete::Completion<'_> {
    async fn map_jobs(&mut self, keys: &[(String, String)]) -> Result<Vec<MapJob>> {
        let rows = sqlx::query(
            "SELECT j.id, j.run_id, j.stage, j.attempt, j.map_stage,
                    j.map_output, j.map_cap, j.map_count, j.outputs
             FROM jobs j JOIN UNNEST($1::TEXT[], $2::TEXT[]) AS k(run_id, stage)
               ON j.run_id = k.run_id AND j.stage = k.stage
             WHERE j.state = 'mapping'
             ORDER BY j.id
             FOR NO KEY UPDATE OF j",
        )
        .bind(column(keys, |k| k.0.as_str()))
        .bind(column(keys, |k| k.1.as_str()))
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
             WHERE run_id = $1 AND stage = $2 AND output = $3",
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
        let n = elements.len() as i64;
        sqlx::query(
            "INSERT INTO artifacts (run_id, stage, output, media_type, bytes, digest, size,
                                    attempt, plugin_digest, created_at)
             SELECT $1, $2, e.output, e.media_type, e.bytes, e.digest, length(e.bytes), $3, $4, $5
             FROM UNNEST($6::TEXT[], $7::TEXT[], $8::BYTEA[], $9::TEXT[])
                  AS e(output, media_type, bytes, digest)
             ON CONFLICT (run_id, stage, output) DO NOTHING",
        )
        .bind(&m.run_id)
        .bind(&m.source.0)
        .bind(elements.first().map_or(0, |e| e.attempt))
        .bind(elements.first().and_then(|e| e.plugin_digest))
        .bind(now)
        .bind(column(elements, |e| e.artifact.name.as_str()))
        .bind(column(elements, |e| e.artifact.media_type.as_str()))
        .bind(column(elements, |e| e.artifact.bytes.as_slice()))
        .bind(column(elements, |e| e.artifact.digest.as_str()))
        .execute(&mut **self.0)
        .await?;
        sqlx::query(
            "WITH made AS (
                 INSERT INTO jobs (run_id, stage, plugin_digest, outputs, emits, state, pending,
                                   max_attempts, next_run_at, created_at, updated_at)
                 SELECT m.run_id, m.stage || '[' || e.i || ']', m.plugin_digest, m.outputs,
                        m.emits, 'ready', 0, m.max_attempts, $2, $2, $2
                 FROM jobs m CROSS JOIN generate_series(0, $3 - 1) AS e(i)
                 WHERE m.id = $1 ORDER BY e.i
             ), bound AS (
                 INSERT INTO job_inputs (run_id, stage, input, from_stage, from_output)
                 SELECT b.run_id, b.stage || '[' || e.i || ']', b.input, b.from_stage,
                        CASE WHEN b.from_stage = $6 AND b.from_output = $7
                             THEN b.from_output || '[' || e.i || ']' ELSE b.from_output END
                 FROM job_inputs b CROSS JOIN generate_series(0, $3 - 1) AS e(i)
                 WHERE b.run_id = $4 AND b.stage = $5
             ), edged AS (
                 INSERT INTO edges (run_id, from_stage, to_stage, kind, satisfied)
                 SELECT $4, $6, $5 || '[' || e.i || ']', 'data', 1
                 FROM generate_series(0, $3 - 1) AS e(i)
                 UNION ALL
                 SELECT $4, $5 || '[' || e.i || ']', $5, 'data', 0
                 FROM generate_series(0, $3 - 1) AS e(i)
             )
             UPDATE jobs SET map_count = $3, pending = $3,
                    state = CASE WHEN $3 > 0 THEN 'blocked' ELSE state END, updated_at = $2
             WHERE id = $1",
        )
        .bind(m.job_id)
        .bind(now)
        .bind(n)
        .bind(&m.run_id)
        .bind(&m.stage)
        .bind(&m.source.0)
        .bind(&m.source.1)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn element_outputs(&mut self, m: &MapJob, output: &str) -> Result<Vec<StoredBytes>> {
        let rows = sqlx::query(
            "SELECT a.bytes, a.media_type, a.attempt, a.plugin_digest
             FROM generate_series(0, $1 - 1) AS e(i)
             JOIN artifacts a
               ON a.run_id = $2 AND a.stage = $3 || '[' || e.i || ']' AND a.output = $4
             ORDER BY e.i",
        )
        .bind(m.count.unwrap_or(0))
        .bind(&m.run_id)
        .bind(&m.stage)
        .bind(output)
        .fetch_all(&mut **self.0)
        .await?;
        rows.iter().map(StoredBytes::from_row).collect()
    }
}
