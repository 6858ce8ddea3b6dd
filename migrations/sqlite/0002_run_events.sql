-- A run's history beyond its jobs: explicit upgrades of a stage's plugin.
CREATE TABLE run_events (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id),
    stage  TEXT,
    kind   TEXT NOT NULL,
    detail TEXT NOT NULL,
    at     INTEGER NOT NULL
);
CREATE INDEX run_events_run ON run_events (run_id, id);
