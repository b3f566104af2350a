"""Libraries the tests, benchmarks and the command line share: the in-memory cluster, the
scenario engines and the trace simulator. Nothing here imports the `fairlane` command line."""
