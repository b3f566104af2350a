-- The read models the projector writes and the API reads. Every table is rebuilt from the
-- log by `fairlane projections rebuild`; `projector_position` says how far they go.

CREATE TABLE projector_position (
    name text PRIMARY KEY,
    seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE timeline (
    seq bigint PRIMARY KEY,
    time double precision NOT NULL,
    type text NOT NULL,
    event_id text NOT NULL,
    actor text NOT NULL,
    causation text,
    job_id text,
    project text,
    pool text,
    nodes text[] NOT NULL,
    reason text,
    for_job text,
    applied boolean NOT NULL,
    data jsonb NOT NULL
);
CREATE INDEX timeline_by_job ON timeline (job_id, seq) WHERE job_id IS NOT NULL;
CREATE INDEX timeline_by_project ON timeline (project, seq) WHERE project IS NOT NULL;
CREATE INDEX timeline_by_type ON timeline (type, seq);
CREATE INDEX timeline_by_time ON timeline (time);
CREATE INDEX timeline_by_node ON timeline USING gin (nodes);

CREATE TABLE jobs (
    job_id text PRIMARY KEY,
    "order" bigint NOT NULL,
    project text NOT NULL,
    pool text,
    pools text[] NOT NULL,
    state text NOT NULL,
    priority integer NOT NULL,
    preemptible boolean NOT NULL,
    gpus integer NOT NULL,
    replicas integer NOT NULL,
    min_replicas integer NOT NULL,
    attempt integer NOT NULL,
    gpus_held integer NOT NULL,
    nodes text[] NOT NULL,
    submitted_at double precision NOT NULL,
    state_since double precision NOT NULL,
    queued_s double precision NOT NULL,
    running_s double precision NOT NULL,
    gpu_s double precision NOT NULL,
    accounted_at double precision NOT NULL,
    first_started_at double precision,
    preemptions integer NOT NULL,
    nominated boolean NOT NULL,
    stop_reason text NOT NULL,
    reject_reason text NOT NULL,
    last_seq bigint NOT NULL
);
CREATE INDEX jobs_by_order ON jobs ("order");
CREATE INDEX jobs_by_project ON jobs (project, "order");
CREATE INDEX jobs_by_state ON jobs (state, "order");
CREATE INDEX jobs_by_pool ON jobs (pool, "order");

CREATE TABLE nodes (
    node text PRIMARY KEY,
    pool text NOT NULL,
    gpus integer NOT NULL,
    free integer NOT NULL,
    lost boolean NOT NULL,
    registered_at double precision NOT NULL,
    lost_at double precision,
    last_seq bigint NOT NULL
);

CREATE TABLE project_pools (
    project text NOT NULL,
    pool text NOT NULL,
    quota integer NOT NULL,
    over_quota_weight integer NOT NULL,
    "limit" integer,
    priority integer NOT NULL,
    usage integer NOT NULL,
    fair_share integer NOT NULL,
    over_quota boolean NOT NULL,
    last_seq bigint NOT NULL,
    PRIMARY KEY (project, pool)
);

CREATE TABLE over_quota_periods (
    project text NOT NULL,
    pool text NOT NULL,
    started_seq bigint NOT NULL,
    started_at double precision NOT NULL,
    ended_at double precision,
    ended_seq bigint,
    PRIMARY KEY (project, pool, started_seq)
);

CREATE TABLE preemptions (
    seq bigint PRIMARY KEY,
    victim text NOT NULL,
    attempt integer NOT NULL,
    reason text NOT NULL,
    beneficiary text,
    pool text,
    replicas integer NOT NULL,
    gpus integer NOT NULL,
    requested_at double precision NOT NULL,
    preempted_at double precision,
    checkpointed boolean,
    work_lost_gpu_s double precision
);
CREATE INDEX preemptions_by_victim ON preemptions (victim, seq);
CREATE INDEX preemptions_by_beneficiary ON preemptions (beneficiary, seq);

-- API tokens: only a hash of each token is kept.
CREATE TABLE api_tokens (
    name text PRIMARY KEY,
    token_sha256 text NOT NULL UNIQUE,
    admin boolean NOT NULL,
    projects text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
