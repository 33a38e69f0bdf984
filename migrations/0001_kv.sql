-- The embedded store: Consul's KV model in SQLite.

-- One monotonic index for every write, and the highest index of any tombstone reaped so far
-- (listing indexes never fall below it, so reaping never makes a watch index go backwards).
-- Index 1 is what an empty listing reports, so the first write takes index 2.
CREATE TABLE meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) STRICT;
INSERT INTO meta (name, value) VALUES ('last_index', 1), ('reaped_index', 0);

-- Keys are BLOBs so that a prefix is a byte range served by the primary key.
CREATE TABLE kv (
    key          BLOB PRIMARY KEY NOT NULL,
    value        BLOB NOT NULL,
    create_index INTEGER NOT NULL,
    modify_index INTEGER NOT NULL,
    lock_index   INTEGER NOT NULL DEFAULT 0,
    session      TEXT
) STRICT;
CREATE INDEX kv_by_session ON kv (session) WHERE session IS NOT NULL;

-- Deleted keys, so that a watch on a prefix sees deletes.
CREATE TABLE tombstones (
    key           BLOB PRIMARY KEY NOT NULL,
    delete_index  INTEGER NOT NULL,
    deleted_at_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY NOT NULL,
    name          TEXT NOT NULL,
    ttl_ms        INTEGER NOT NULL,
    lock_delay_ms INTEGER NOT NULL,
    behavior      TEXT NOT NULL CHECK (behavior IN ('release', 'delete')),
    create_index  INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
) STRICT;

-- Keys freed by an invalidated session stay unacquirable until `until_ms`.
CREATE TABLE lock_delays (
    key      BLOB PRIMARY KEY NOT NULL,
    until_ms INTEGER NOT NULL
) STRICT;
