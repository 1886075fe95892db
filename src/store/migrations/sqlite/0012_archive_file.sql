-- latch schema: the readings' archive in a file of its own (`archive.db`, see
-- src/store/sqlite/archive.rs), with a writer of its own.
--
-- Nothing changes in `latch.db` here: at every start, an archive table there that holds
-- readings stays in use, and an empty one (this folder's migrations just made it) is
-- dropped for `archive.db`. The version is what changes: a latch older than this one
-- would find no archive table in a folder that moved it out, so it refuses the folder.
SELECT 1;
