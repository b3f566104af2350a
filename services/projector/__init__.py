"""The projector: follows the log and keeps the PostgreSQL read models (see projections/)."""
