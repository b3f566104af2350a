-- A node taken out of service by an operator: '' in service, 'cordoned' (no new work) or
-- 'drained' (no new work, and its jobs asked to stop and move).
ALTER TABLE nodes ADD COLUMN cordon text NOT NULL DEFAULT '';
