-- Ratchet schema, PostgreSQL: the same tables as migrations/sqlite. Times
-- are milliseconds since the Unix epoch, taken from the caller's clock.
-- `seq` values come from `ratchet_seq` and order claims after the
-- completions they depend on (audited happens-before).

-- Postgres orders claims and completions with a sequence instead of the
-- SQLite counter row, so that workers never queue on one row lock.
CREATE SEQUENCE ratchet_seq;

CREATE TABLE plugins (
    digest        TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    manifest      TEXT NOT NULL,
    component     BYTEA NOT NULL,
    size          BIGINT NOT NULL,
    registered_at BIGINT NOT NULL,
    yanked        BIGINT NOT NULL DEFAULT 0,
    UNIQUE (name, version)
);

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    pipeline        TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'succeeded', 'failed')),
    idempotency_key TEXT UNIQUE,
    created_at      BIGINT NOT NULL,
    finished_at     BIGINT
);

CREATE TABLE jobs (
    id               BIGSERIAL PRIMARY KEY,
    run_id           TEXT NOT NULL REFERENCES runs (id),
    stage            TEXT NOT NULL,
    plugin_digest    TEXT NOT NULL REFERENCES plugins (digest),
    emits            TEXT NOT NULL, -- JSON array of outbox event names
    outputs          TEXT NOT NULL, -- JSON array of declared output names
    state            TEXT NOT NULL CHECK (state IN
                        ('blocked', 'ready', 'running', 'succeeded', 'failed', 'dead', 'cancelled')),
    pending          BIGINT NOT NULL,
    attempt          BIGINT NOT NULL DEFAULT 0,
    max_attempts     BIGINT NOT NULL,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    next_run_at      BIGINT NOT NULL,
    last_error       TEXT,
    succeeded_seq    BIGINT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    UNIQUE (run_id, stage)
);
CREATE INDEX jobs_claimable ON jobs (state, next_run_at);

CREATE TABLE edges (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    from_stage TEXT NOT NULL,
    to_stage   TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('data', 'after')),
    satisfied  BIGINT NOT NULL DEFAULT 0,
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
    bytes         BYTEA NOT NULL,
    digest        TEXT NOT NULL,
    size          BIGINT NOT NULL,
    attempt       BIGINT NOT NULL,
    plugin_digest TEXT,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (run_id, stage, output)
);

CREATE TABLE model_calls (
    run_id         TEXT NOT NULL REFERENCES runs (id),
    stage          TEXT NOT NULL,
    call_index     BIGINT NOT NULL,
    request_digest TEXT NOT NULL,
    response       TEXT NOT NULL,
    attempt        BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (run_id, stage, call_index)
);

CREATE TABLE outbox (
    id           BIGSERIAL PRIMARY KEY,
    dedup_key    TEXT NOT NULL UNIQUE,
    run_id       TEXT NOT NULL REFERENCES runs (id),
    stage        TEXT NOT NULL,
    event        TEXT NOT NULL,
    payload      TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    published_at BIGINT
);
CREATE INDEX outbox_unpublished ON outbox (published_at, id);

CREATE TABLE attempts (
    job_id            BIGINT NOT NULL REFERENCES jobs (id),
    attempt           BIGINT NOT NULL,
    run_id            TEXT NOT NULL,
    stage             TEXT NOT NULL,
    worker            TEXT NOT NULL,
    plugin_digest     TEXT NOT NULL,
    claim_seq         BIGINT NOT NULL,
    claimed_at        BIGINT NOT NULL,
    finished_at       BIGINT,
    outcome           TEXT NOT NULL CHECK (outcome IN
                        ('running', 'succeeded', 'failed', 'lease_expired')),
    error             TEXT,
    input_digests     TEXT, -- JSON object: input name -> digest consumed
    proposal_digests  TEXT, -- JSON object: output name -> digest proposed
    canonical_digests TEXT, -- JSON object: output name -> digest committed
    proposal_won      BIGINT,
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX attempts_run ON attempts (run_id, stage);
