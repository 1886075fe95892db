-- latch schema: `latch.db` records that the readings' archive was made in its own file,
-- `archive.db` (src/store/sqlite/archive.rs). SQLite makes a database it is asked to attach
-- when the file is missing, so a folder whose `archive.db` was lost (a power cut that kept
-- `latch.db`'s later writes but not the file's name, a copy of the folder without it) would
-- open with an empty archive and every archived reading gone, without a word. With this
-- row, such a folder is refused. Folders made before this version get the row at their next
-- start, with the file as it is then.
CREATE TABLE archive_made (
    at INTEGER NOT NULL
);
