-- A key written again is no longer deleted: its tombstone goes within the write's own
-- statement, rather than in a second statement after each write. (An update of a key that
-- exists fires no INSERT trigger; such a key has no tombstone.)
CREATE TRIGGER kv_insert_clears_tombstone AFTER INSERT ON kv
BEGIN
    DELETE FROM tombstones WHERE key = NEW.key;
END;
