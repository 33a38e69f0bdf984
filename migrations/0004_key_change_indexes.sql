-- Rows and tombstones by key with the index of their last change, so that the newest change
-- under a quiet prefix (none among the newest entries of the change indexes) is read from
-- this index alone, without visiting the rows of the prefix.
CREATE INDEX kv_by_key_change ON kv (key, modify_index);
CREATE INDEX tombstones_by_key_change ON tombstones (key, delete_index);
