-- Dead letters are found by an index of their own (docs/relay.md):
-- counting them for the metrics and redelivering every one no longer
-- reads every delivery ever made. It holds only dead deliveries, so
-- recording any other result writes nothing to it.
CREATE INDEX deliveries_dead ON deliveries (sink) WHERE state = 'dead';
