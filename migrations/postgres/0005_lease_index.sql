-- Claims look for expired leases first, in (lease_expires_at, id) order.
-- Through jobs_claimable they read every index entry of state 'running',
-- and on Postgres that includes the entries of every job that has run since
-- the last vacuum (an update leaves the old entry behind): a claim's cost
-- grew with the stages finished. This index holds running jobs only, in
-- the order the claim takes them, so a claim reads only expired leases.
CREATE INDEX jobs_leases ON jobs (lease_expires_at, id) WHERE state = 'running';
