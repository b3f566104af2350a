-- Rule 11: a project's decayed usage U in a pool with a usage half-life (its part of the
-- pool's decayed GPU-seconds), refreshed by the projector at the end of each batch. NULL while
-- the pool has no half-life.
ALTER TABLE project_pools ADD COLUMN decayed_usage double precision;
