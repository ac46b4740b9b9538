-- A record given up on with the provider's outcome unknown (its stored
-- answer is 500 request_abandoned) gets its own state, 'abandoned': it is
-- replayed, and never reclaimed nor pruned, since the money may have moved.

ALTER TABLE idempotent_requests DROP CONSTRAINT idempotent_requests_state_known;
ALTER TABLE idempotent_requests ADD CONSTRAINT idempotent_requests_state_known
    CHECK (state IN ('in_progress', 'complete', 'abandoned'));
UPDATE idempotent_requests SET state = 'abandoned'
    WHERE state = 'complete' AND response_status = 500;
