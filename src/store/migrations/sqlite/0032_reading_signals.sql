-- A reading's battery, tamper flag and fault in history (issue #72): the journal's columns
-- here; the archive's, which may be a file of its own, are added when it is attached
-- (src/store/sqlite/archive.rs). `fault` is NULL when the reading said nothing of it, ''
-- for `null` (cleared).
ALTER TABLE readings ADD COLUMN battery INTEGER;
ALTER TABLE readings ADD COLUMN tamper INTEGER;
ALTER TABLE readings ADD COLUMN fault TEXT;
