"""The HTTP API: commands to admission and the ledger over NATS, queries on the read models."""
