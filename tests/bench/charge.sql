-- One new charge, as the PostgreSQL store does it: the pgbench ceiling of
-- `make bench` (tests/bench/main.rs), which divides the API's new charges/s
-- by this script's tps. MIRRORS crates/store/src/sql.rs (PostgreSQL's
-- `claim_or_read`, then `finish_one`, as crates/domain/src/service.rs
-- `create_charge` calls them for a new key): keep the two in sync.
--
-- Keys and charge ids are unique per transaction (client id plus a random
-- number), so the claim always inserts. Values have the server's shapes and
-- sizes; every time is the database's clock when the row is written.

\set n random(1, 1000000000000000000)

-- 1. The claim (`claim_or_read`): the record and its pending charge in one
-- statement; a known key (a replay) would be read and returned instead.
WITH existing AS (
  SELECT id, idempotency_key, route, customer_id, request_hash, state, lease_token,
    locked_until, charge_id, response_status, response_body, response_content_type,
    response_location, created_at, completed_at, expires_at,
    (locked_until IS NOT NULL AND locked_until > date_trunc('milliseconds', clock_timestamp()))::int::int8 AS lease_live,
    (expires_at <= date_trunc('milliseconds', clock_timestamp()))::int::int8 AS expired,
    (EXTRACT(EPOCH FROM (date_trunc('milliseconds', clock_timestamp()) - created_at)) * 1000)::int8 AS age_ms
    FROM idempotent_requests
   WHERE idempotency_key = 'bench-' || lpad(:client_id::text, 11, '0') || '-' || lpad(:n::text, 19, '0')
     AND route = 'POST /api/charges'),
claimed AS (
  INSERT INTO idempotent_requests (idempotency_key, route, customer_id,
    request_hash, state, lease_token, locked_until, charge_id, created_at,
    expires_at)
  SELECT 'bench-' || lpad(:client_id::text, 11, '0') || '-' || lpad(:n::text, 19, '0'),
          'POST /api/charges', 'cus_load',
          '43d26cb3be1892bd67af724e50c40ccd7ae629f1b3f2e1a2e86dac7d2c6717d3',
          'in_progress', 'lease' || lpad(:client_id::text, 8, '0') || lpad(:n::text, 19, '0'),
          date_trunc('milliseconds', clock_timestamp()) + (60000::float8 * interval '1 millisecond'),
          'ch_' || lpad(:client_id::text, 13, '0') || lpad(:n::text, 19, '0'),
          date_trunc('milliseconds', clock_timestamp()), date_trunc('milliseconds', clock_timestamp()) + (86400000::float8 * interval '1 millisecond')
  WHERE NOT EXISTS (SELECT 1 FROM existing)
  ON CONFLICT (idempotency_key, route) DO NOTHING
  RETURNING id, idempotency_key, route, customer_id, request_hash, state, lease_token,
    locked_until, charge_id, response_status, response_body, response_content_type,
    response_location, created_at, completed_at, expires_at,
    (locked_until IS NOT NULL AND locked_until > date_trunc('milliseconds', clock_timestamp()))::int::int8 AS lease_live,
    (expires_at <= date_trunc('milliseconds', clock_timestamp()))::int::int8 AS expired,
    (EXTRACT(EPOCH FROM (date_trunc('milliseconds', clock_timestamp()) - created_at)) * 1000)::int8 AS age_ms),
charge AS (
  INSERT INTO charges (id, customer_id, amount_cents, currency, card_token,
    description, metadata, status, provider_key, gateway_charge_id,
    decline_code, created_at, updated_at)
  SELECT 'ch_' || lpad(:client_id::text, 13, '0') || lpad(:n::text, 19, '0'),
         'cus_load', 100, 'GBP', 'tok_visa', 'payments-load new',
         ('{"load_op":"new-' || :n || '","load_run":"load-0123456789abcdef0123456789abcdef"}')::jsonb,
         'pending',
         'payments-charge-ch_' || lpad(:client_id::text, 13, '0') || lpad(:n::text, 19, '0'),
         NULL, NULL, created_at, created_at
  FROM claimed)
SELECT true AS claimed, * FROM claimed
UNION ALL
SELECT false, * FROM existing \gset

-- (The provider call happens here, with no transaction or connection held.)

-- 2. The finish (`try_finish`): the record completes with the stored answer,
-- guarded by the lease token, and its charge is settled.
WITH done AS (
  UPDATE idempotent_requests SET state = 'complete', response_status = 201,
    response_body = '{"id":"ch_' || lpad(:client_id::text, 13, '0') || lpad(:n::text, 19, '0')
        || '","customer_id":"cus_load","amount_cents":100,"currency":"GBP","status":"succeeded",'
        || '"description":"payments-load new","metadata":{"load_op":"new-' || :n
        || '","load_run":"load-0123456789abcdef0123456789abcdef"},'
        || '"gateway_charge_id":"ch_whF4sGDcKVkjbo1t4xc9syZW","created_at":"2026-11-30T00:29:50.929Z"}',
    response_content_type = 'application/json',
    response_location = '/api/charges/ch_' || lpad(:client_id::text, 13, '0') || lpad(:n::text, 19, '0'),
    completed_at = date_trunc('milliseconds', clock_timestamp()), lease_token = NULL, locked_until = NULL
  WHERE id = :id AND state = 'in_progress'
    AND lease_token = 'lease' || lpad(:client_id::text, 8, '0') || lpad(:n::text, 19, '0')
  RETURNING charge_id),
settled AS (
  UPDATE charges SET status = 'succeeded', gateway_charge_id = 'ch_whF4sGDcKVkjbo1t4xc9syZW',
    decline_code = NULL, updated_at = date_trunc('milliseconds', clock_timestamp())
  FROM done WHERE charges.id = done.charge_id
    AND charges.id = 'ch_' || lpad(:client_id::text, 13, '0') || lpad(:n::text, 19, '0')
  RETURNING charges.id)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM settled);
