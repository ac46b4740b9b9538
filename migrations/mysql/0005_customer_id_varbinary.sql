-- Customer ids compare exactly. Under utf8mb4_bin, a PAD SPACE collation,
-- 'cus_a ' equals 'cus_a', so a token for the first listed the second's
-- charges. VARBINARY compares bytes, trailing spaces included, on MySQL 8
-- and MariaDB alike (no NO PAD collation has one name on both). The bytes
-- stay the UTF-8 they were; the store reads them back as text.
--
-- Each ALTER rebuilds its table (a copy): writes to it wait until it ends,
-- and on Galera (TOI) writes to the whole cluster do. docs/operations.md
-- says when to run it.

ALTER TABLE charges MODIFY customer_id VARBINARY(255) NOT NULL;
ALTER TABLE refunds MODIFY customer_id VARBINARY(255) NOT NULL;
ALTER TABLE idempotent_requests MODIFY customer_id VARBINARY(255) NOT NULL;
