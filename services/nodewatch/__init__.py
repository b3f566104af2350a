"""The node watcher: declares nodes whose heartbeats lapsed lost (one fenced leader)."""
