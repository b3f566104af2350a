-- Ports a job's replicas publish on their nodes (`HOST:CONTAINER`), and where they are reached
-- while it holds replicas: `http://<node address>:<host port>`, one per replica and port.
ALTER TABLE jobs ADD COLUMN ports text[] NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN urls text[] NOT NULL DEFAULT '{}';
