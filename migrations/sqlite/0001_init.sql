-- Ratchet schema, SQLite. Times are milliseconds since the Unix epoch, taken
-- from the caller's clock. `seq` values come from the one-row `counters`
-- table and totally order claims and completions (audited happens-before).

CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('seq', 0);

CREATE TABLE plugins (
    digest        TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    manifest      TEXT NOT NULL,
    component     BLOB NOT NULL,
    size          INTEGER NOT NULL,
    registered_at INTEGER NOT NULL,
    yanked        INTEGER NOT NULL DEFAULT 0,
    UNIQUE (name, version)
);

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    pipeline        TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'succeeded', 'failed')),
    idempotency_key TEXT UNIQUE,
    created_at      INTEGER NOT NULL,
    finished_at     INTEGER
);

CREATE TABLE jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id           TEXT NOT NULL REFERENCES runs (id),
    stage            TEXT NOT NULL,
    plugin_digest    TEXT NOT NULL REFERENCES plugins (digest),
    emits            TEXT NOT NULL, -- JSON array of outbox event names
    outputs          TEXT NOT NULL, -- JSON array of declared output names
    state            TEXT NOT NULL CHECK (state IN
                        ('blocked', 'ready', 'running', 'succeeded', 'failed', 'dead', 'cancelled')),
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
    UNIQUE (run_id, stage)
);
CREATE INDEX jobs_claimable ON jobs (state, next_run_at);

CREATE TABLE edges (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    from_stage TEXT NOT NULL,
    to_stage   TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('data', 'after')),
    satisfied  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, from_stage, to_stage, kind)
);
CREATE INDEX edges_to ON edges (run_id, to_stage);

CREATE TABLE job_inputs (
    run_id      TEXT NOT NULL REFERENCES runs (id),
    stage       TEXT NOT NULL,
    input       TEXT NOT NULL,
    from_stage  TEXT NOT NULL,
    from_output TEXT NOT NULL,
    PRIMARY KEY (run_id, stage, input)
);

CREATE TABLE artifacts (
    run_id        TEXT NOT NULL REFERENCES runs (id),
    stage         TEXT NOT NULL,
    output        TEXT NOT NULL,
    media_type    TEXT NOT NULL,
    bytes         BLOB NOT NULL,
    digest        TEXT NOT NULL,
    size          INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    plugin_digest TEXT,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (run_id, stage, output)
);

CREATE TABLE model_calls (
    run_id         TEXT NOT NULL REFERENCES runs (id),
    stage          TEXT NOT NULL,
    call_index     INTEGER NOT NULL,
    request_digest TEXT NOT NULL,
    response       TEXT NOT NULL,
    attempt        INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (run_id, stage, call_index)
);

CREATE TABLE outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    dedup_key    TEXT NOT NULL UNIQUE,
    run_id       TEXT NOT NULL REFERENCES runs (id),
    stage        TEXT NOT NULL,
    event        TEXT NOT NULL,
    payload      TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER
);
CREATE INDEX outbox_unpublished ON outbox (published_at, id);

CREATE TABLE attempts (
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
                        ('running', 'succeeded', 'failed', 'lease_expired')),
    error             TEXT,
    input_digests     TEXT, -- JSON object: input name -> digest consumed
    proposal_digests  TEXT, -- JSON object: output name -> digest proposed
    canonical_digests TEXT, -- JSON object: output name -> digest committed
    proposal_won      INTEGER,
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX attempts_run ON attempts (run_id, stage);
