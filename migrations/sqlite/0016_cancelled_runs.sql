-- no-transaction
-- A run an operator stopped is `cancelled`, and so is the attempt it
-- fenced out (`ratchet cancel`, docs/job-states.md). SQLite cannot change
-- a CHECK in place: `runs` and `attempts` are rebuilt, as SQLite's manual
-- says to (foreign keys off, one transaction; every row keeps its key).
-- Every step is repeatable, so a migration whose record was lost runs
-- again without harm.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

CREATE TABLE runs_rebuilt (
    id              TEXT PRIMARY KEY,
    pipeline        TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    idempotency_key TEXT UNIQUE,
    created_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    unfinished      INTEGER NOT NULL DEFAULT 0,
    failed_seq      INTEGER,
    generation      INTEGER NOT NULL DEFAULT 1
);
INSERT INTO runs_rebuilt (id, pipeline, state, idempotency_key, created_at, finished_at,
                          unfinished, failed_seq, generation)
SELECT id, pipeline, state, idempotency_key, created_at, finished_at,
       unfinished, failed_seq, generation
FROM runs;
DROP TABLE runs;
ALTER TABLE runs_rebuilt RENAME TO runs;
CREATE INDEX runs_running ON runs (id) WHERE state = 'running';

CREATE TABLE attempts_rebuilt (
    job_id            INTEGER NOT NULL REFERENCES jobs (id),
    attempt           INTEGER NOT NULL,
    run_id            TEXT NOT NULL,
    stage             TEXT NOT NULL,
    worker            TEXT NOT NULL,
    plugin_digest     TEXT NOT NULL,
    claim_seq         INTEGER NOT NULL,
    claimed_at        INTEGER NOT NULL,
    finished_at       INTEGER,
    outcome           TEXT NOT NULL CHECK (outcome IN
                        ('running', 'succeeded', 'failed', 'lease_expired', 'cancelled')),
    error             TEXT,
    input_digests     TEXT, -- JSON object: input name -> digest consumed
    proposal_digests  TEXT, -- JSON object: output name -> digest proposed
    canonical_digests TEXT, -- JSON object: output name -> digest committed
    proposal_won      INTEGER,
    deps_seen         INTEGER,
    PRIMARY KEY (job_id, attempt)
);
INSERT INTO attempts_rebuilt (job_id, attempt, run_id, stage, worker, plugin_digest, claim_seq,
                              claimed_at, finished_at, outcome, error, input_digests,
                              proposal_digests, canonical_digests, proposal_won, deps_seen)
SELECT job_id, attempt, run_id, stage, worker, plugin_digest, claim_seq,
       claimed_at, finished_at, outcome, error, input_digests,
       proposal_digests, canonical_digests, proposal_won, deps_seen
FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_rebuilt RENAME TO attempts;
CREATE INDEX attempts_run ON attempts (run_id, stage);

COMMIT;
PRAGMA foreign_keys = ON;
