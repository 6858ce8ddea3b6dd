-- Reconcile pages through the running runs alone (store/reconcile.rs): a
-- run leaves this index when it finishes, so a reconcile never reads the
-- finished ones, however many there are.
CREATE INDEX runs_running ON runs (id) WHERE state = 'running';
