-- The provider events that are open (issue 29): waiting (they name one of
-- our operations that has no row yet) and needs_person (applied as far as
-- they could be; `detail` says what is left for a person). The jobs runner
-- applies both again until they are applied, so the index that finds them
-- covers both states (0011's covered waiting only). 0011 is kept as it
-- landed: a migration already applied somewhere is never edited, or sqlx
-- refuses that database ("previously applied but has been modified").
DROP INDEX provider_events_waiting;
CREATE INDEX provider_events_open ON provider_events (updated_at) WHERE state IN ('waiting', 'needs_person');
