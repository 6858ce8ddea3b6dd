-- Stages' HTTP requests (`wasi:http`) are journaled beside their model
-- calls, under the same call index: one journal per stage, one order.
-- `kind` says which a row is. For an HTTP row, `response` holds the body's
-- bytes (or, `rejected`, why none was kept), `http_status` the status and
-- `http_headers` the headers as a JSON list of [name, value] pairs, any
-- secret's value already replaced by its placeholder.
ALTER TABLE model_calls ADD COLUMN kind TEXT NOT NULL DEFAULT 'model';
ALTER TABLE model_calls ADD COLUMN http_status INTEGER;
ALTER TABLE model_calls ADD COLUMN http_headers TEXT;
