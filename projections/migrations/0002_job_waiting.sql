-- Why the policy leaves each pending job waiting: its own reason code (no_fit, limit, quota,
-- preemption_delay, held, nominated, no_pool), computed by the projector from a scheduling
-- cycle on the state at the end of each batch. '' while the job is not waiting.
ALTER TABLE jobs ADD COLUMN waiting text NOT NULL DEFAULT '';
