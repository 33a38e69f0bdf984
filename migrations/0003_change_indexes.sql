-- Rows and tombstones by the index of their last change, with their key, so that what
-- changed under a prefix since a recent index, and a busy prefix's newest change, are found
-- by reading the few newest entries of an index rather than every row of the prefix.
CREATE INDEX kv_by_change ON kv (modify_index, key);
CREATE INDEX tombstones_by_change ON tombstones (delete_index, key);
