"""The preemptor: picks victims for entitled pending jobs and holds the GPUs they free."""
