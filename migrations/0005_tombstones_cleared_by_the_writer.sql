-- The writer clears the tombstones of the keys it writes, a statement per batch of rows,
-- rather than a trigger per row inserted: in key order, each page of the tombstones' index is
-- read once per statement.
DROP TRIGGER kv_insert_clears_tombstone;
