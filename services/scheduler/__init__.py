"""The scheduler: places admitted jobs on free GPUs (gangs whole, per the pool's fitting)."""
