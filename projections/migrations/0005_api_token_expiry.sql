-- API tokens may expire: Unix seconds after which the token is refused (NULL: never). A
-- revoked token is deleted, so a name can be given again.
ALTER TABLE api_tokens ADD COLUMN expires_at double precision;
