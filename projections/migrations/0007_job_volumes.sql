-- Host folders a job's containers mount, `HOST:CONTAINER:ro` or `:rw`.
ALTER TABLE jobs ADD COLUMN volumes text[] NOT NULL DEFAULT '{}';
