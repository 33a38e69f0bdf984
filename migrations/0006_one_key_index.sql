-- The rows' keys in one index rather than two. The primary key's own index (by key) and
-- `kv_by_key_change` (by key, then change index) were both in key order, so each row the
-- writer wrote landed on a random page of each. `kv_by_key_change` alone serves every
-- lookup by key; the writer, the only one to write rows (in `BEGIN IMMEDIATE`
-- transactions), keeps one row per key by deleting a key's row before it inserts it again.
CREATE TABLE kv_one_key_index (
    key          BLOB NOT NULL,
    value        BLOB NOT NULL,
    create_index INTEGER NOT NULL,
    modify_index INTEGER NOT NULL,
    lock_index   INTEGER NOT NULL DEFAULT 0,
    session      TEXT
) STRICT;
INSERT INTO kv_one_key_index (key, value, create_index, modify_index, lock_index, session)
    SELECT key, value, create_index, modify_index, lock_index, session FROM kv ORDER BY key;
DROP TABLE kv;
ALTER TABLE kv_one_key_index RENAME TO kv;
CREATE INDEX kv_by_session ON kv (session) WHERE session IS NOT NULL;
CREATE INDEX kv_by_change ON kv (modify_index, key);
CREATE UNIQUE INDEX kv_by_key_change ON kv (key, modify_index);
