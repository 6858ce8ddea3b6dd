//! `plugins`: content-addressed, immutable components.

use sqlx::Row;

use super::*;
use crate::store::registration::{self, PluginPutTx, VersionKeys};

pub(super) async fn put(store: &PostgresStore, p: PluginPut) -> Result<PluginPutOutcome> {
    let mut tx = store.begin_write().await?;
    let outcome = registration::put(&mut Putting(&mut tx), p).await?;
    if outcome == PluginPutOutcome::Inserted {
        tx.commit().await?;
    }
    Ok(outcome)
}

/// The statements of `store::registration` on a write transaction.
struct Putting<'t>(&'t mut Tx);

impl PluginPutTx for Putting<'_> {
    async fn plugin_insert(&mut self, p: &PluginPut) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO plugins (digest, name, version, version_key, manifest, component, size,
                                  registered_at, contract)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
        )
        .bind(&p.digest)
        .bind(&p.name)
        .bind(&p.version)
        .bind(rows::version_key_of(&p.version)?)
        .bind(&p.manifest)
        .bind(&p.component)
        .bind(p.component.len() as i64)
        .bind(p.now)
        .bind(&p.contract)
        .execute(&mut **self.0)
        .await?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn digest_of(&mut self, name: &str, version: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT digest FROM plugins WHERE name = $1 AND version = $2")
                .bind(name)
                .bind(version)
                .fetch_optional(&mut **self.0)
                .await?,
        )
    }
}

pub(super) async fn get(store: &PostgresStore, digest: &str) -> Result<Option<PluginRecord>> {
    let row = sqlx::query("SELECT * FROM plugins WHERE digest = $1")
        .bind(digest)
        .fetch_optional(&store.pool)
        .await?;
    row.map(|row| {
        Ok(PluginRecord {
            summary: rows::plugin_summary(&row)?,
            component: row.try_get("component")?,
        })
    })
    .transpose()
}

pub(super) async fn list(store: &PostgresStore) -> Result<Vec<PluginSummary>> {
    let rows = sqlx::query(
        "SELECT digest, name, version, manifest, size, registered_at, yanked, contract
         FROM plugins ORDER BY name, registered_at",
    )
    .fetch_all(&store.pool)
    .await?;
    rows.iter().map(rows::plugin_summary).collect()
}

pub(super) async fn yank(store: &PostgresStore, name: &str, version: &str) -> Result<bool> {
    let n = sqlx::query("UPDATE plugins SET yanked = 1 WHERE name = $1 AND version = $2")
        .bind(name)
        .bind(version)
        .execute(&store.pool)
        .await?
        .rows_affected();
    Ok(n == 1)
}

pub(super) async fn usage(store: &PostgresStore, digest: &str) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT COUNT(DISTINCT run_id) FROM jobs WHERE plugin_digest = $1")
            .bind(digest)
            .fetch_one(&store.pool)
            .await?,
    )
}

pub(super) async fn versions_of(
    store: &PostgresStore,
    names: &[String],
) -> Result<Vec<PluginVersion>> {
    let rows =
        sqlx::query("SELECT digest, name, version, yanked FROM plugins WHERE name = ANY($1)")
            .bind(names)
            .fetch_all(&store.pool)
            .await?;
    rows.iter().map(rows::plugin_version).collect()
}

pub(super) async fn manifests(
    store: &PostgresStore,
    digests: &[String],
) -> Result<Vec<(String, String)>> {
    Ok(
        sqlx::query_as("SELECT digest, manifest FROM plugins WHERE digest = ANY($1)")
            .bind(digests)
            .fetch_all(&store.pool)
            .await?,
    )
}

/// A page of [`Catalog::plugin_candidates`]: `plugins_by_version` walked
/// backwards from the range's top.
pub(super) async fn candidates(
    store: &PostgresStore,
    name: &str,
    range: &VersionKeyRange,
    offset: i64,
    limit: i64,
) -> Result<Vec<PluginVersion>> {
    let rows = sqlx::query(
        "SELECT digest, name, version, yanked FROM plugins
         WHERE name = $1 AND version_key BETWEEN $2 AND $3 AND yanked = 0
           AND (NOT $4 OR version_key LIKE '%1')
         ORDER BY version_key DESC, digest LIMIT $5 OFFSET $6",
    )
    .bind(name)
    .bind(&range.lowest)
    .bind(&range.highest)
    .bind(range.releases_only)
    .bind(limit)
    .bind(offset)
    .fetch_all(&store.pool)
    .await?;
    rows.iter().map(rows::plugin_version).collect()
}

/// Keys the versions registered before `version_key` existed
/// (`store::registration`).
pub(super) async fn backfill_version_keys(pool: &PgPool) -> Result<()> {
    registration::backfill_version_keys(&mut Keying(pool)).await
}

/// The statements of `store::registration`'s backfill, each on the pool.
struct Keying<'p>(&'p PgPool);

impl VersionKeys for Keying<'_> {
    async fn unkeyed(&mut self, limit: i64) -> Result<Vec<(String, String)>> {
        Ok(
            sqlx::query_as(
                "SELECT digest, version FROM plugins WHERE version_key IS NULL LIMIT $1",
            )
            .bind(limit)
            .fetch_all(self.0)
            .await?,
        )
    }

    async fn key_set(&mut self, digest: &str, key: &str) -> Result<()> {
        sqlx::query("UPDATE plugins SET version_key = $1 WHERE digest = $2")
            .bind(key)
            .bind(digest)
            .execute(self.0)
            .await?;
        Ok(())
    }
}
