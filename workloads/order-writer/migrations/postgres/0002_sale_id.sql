-- A sale is identified by `<namespace>.<name>.<8 hex of its uid>`, up to
-- 128 characters, so sales of one name in two namespaces, or a sale deleted
-- and created again, never share rows.
ALTER TABLE orders ALTER COLUMN sale TYPE VARCHAR(128);
