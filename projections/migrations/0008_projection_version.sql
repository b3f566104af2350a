-- Which version of the projection wrote the read models (`projections.VERSION`): a projector
-- of another version rebuilds them, so that a change to what the same log projects to reaches
-- the rows written before it. Rows written before this column were version 1.
ALTER TABLE projector_position ADD COLUMN version integer NOT NULL DEFAULT 1;
