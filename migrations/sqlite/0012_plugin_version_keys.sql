-- Resolving a requirement walks a plugin's versions from the highest down
-- in an index, stopping at the first that matches, instead of reading
-- every version (registry.rs). `version_key` sorts like semver precedence
-- down to the pre-release (store::version_key); rows registered before
-- this migration get theirs when the store opens (a semver parse the
-- database cannot do), found through `plugins_unkeyed`.
ALTER TABLE plugins ADD COLUMN version_key TEXT;
CREATE INDEX plugins_by_version ON plugins (name, version_key, yanked, digest, version);
CREATE INDEX plugins_unkeyed ON plugins (digest) WHERE version_key IS NULL;
