-- A reading's battery, tamper flag and fault in history (issue #72). `fault` is NULL when
-- the reading said nothing of it, '' for `null` (cleared).
ALTER TABLE readings ADD COLUMN battery INTEGER;
ALTER TABLE readings ADD COLUMN tamper BOOLEAN;
ALTER TABLE readings ADD COLUMN fault TEXT;
