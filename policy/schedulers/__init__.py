"""The schedulers a pool can run. Each offers `allocate` (idle GPUs) and `preempt`."""
