-- no-transaction
-- Approval gates (`approve = "..."` in a pipeline, ADR 0027): a gate's job
-- runs no plugin (`plugin_digest` is NULL, `gate` holds what to check) and
-- waits in the new state `awaiting` for an operator's decision, which is
-- recorded as an attempt that ran no plugin either.
--
-- Maps (`map = "split.parts"`, ADR 0028): a mapped stage's job names its
-- list (`map_stage`, `map_output`) and the most elements it may hold
-- (`map_cap`); released, it is `mapping` for as long as the transaction
-- that releases it expands it into element jobs (`map_count` of them) or
-- joins their outputs. The job of the list's stage knows, in `lists`, which
-- of its outputs are mapped over and how long each may be, so that its
-- attempt fails before committing a list that cannot be mapped.
--
-- SQLite cannot change a CHECK or a NOT NULL in place: `jobs` and `attempts` are rebuilt, as
-- SQLite's manual says to (foreign keys off, one transaction; every row
-- keeps its key). A migration whose record was lost (a crash between its
-- commit and its record) runs again before any gate exists, without harm.
--
-- `attempts_run`, which 0007 dropped and 0016 brought back by mistake, is
-- not rebuilt: no query reads attempts by run and stage, and each attempt
-- paid for its entry.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

CREATE TABLE jobs_rebuilt (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id           TEXT NOT NULL REFERENCES runs (id),
    stage            TEXT NOT NULL,
    plugin_digest    TEXT REFERENCES plugins (digest),
    emits            TEXT NOT NULL, -- JSON array of outbox event names
    outputs          TEXT NOT NULL, -- JSON array of declared output names
    state            TEXT NOT NULL CHECK (state IN
                        ('blocked', 'ready', 'running', 'awaiting', 'mapping', 'succeeded',
                         'failed', 'dead', 'cancelled')),
    pending          INTEGER NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    next_run_at      INTEGER NOT NULL,
    last_error       TEXT,
    succeeded_seq    INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    attempt_budget   INTEGER,
    gate             TEXT, -- what an approval gate asks its approver to check
    gate_timeout_ms  INTEGER, -- how long a gate awaits before rejecting itself
    map_stage        TEXT, -- the list a mapped stage maps over: its stage
    map_output       TEXT, -- and output
    map_cap          INTEGER, -- the most elements the list may hold
    map_count        INTEGER, -- how many element jobs it was expanded into
    lists            TEXT, -- JSON object: output mapped over -> most elements it may hold
    UNIQUE (run_id, stage),
    CHECK ((plugin_digest IS NULL) = (gate IS NOT NULL)),
    CHECK ((map_stage IS NULL) = (map_output IS NULL) AND (map_stage IS NULL) = (map_cap IS NULL))
);
INSERT INTO jobs_rebuilt (id, run_id, stage, plugin_digest, emits, outputs, state, pending,
                          attempt, max_attempts, lease_owner, lease_expires_at, next_run_at,
                          last_error, succeeded_seq, created_at, updated_at, attempt_budget)
SELECT id, run_id, stage, plugin_digest, emits, outputs, state, pending,
       attempt, max_attempts, lease_owner, lease_expires_at, next_run_at,
       last_error, succeeded_seq, created_at, updated_at, attempt_budget
FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_rebuilt RENAME TO jobs;
-- As in 0007, with awaiting gates and mapping maps: the live jobs, by state.
CREATE INDEX jobs_live ON jobs (state, next_run_at, id)
    WHERE state IN ('blocked', 'ready', 'running', 'awaiting', 'mapping');

CREATE TABLE attempts_rebuilt (
    job_id            INTEGER NOT NULL REFERENCES jobs (id),
    attempt           INTEGER NOT NULL,
    run_id            TEXT NOT NULL,
    stage             TEXT NOT NULL,
    worker            TEXT NOT NULL,
    plugin_digest     TEXT, -- NULL for a gate's decision
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

COMMIT;
PRAGMA foreign_keys = ON;
