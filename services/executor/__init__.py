"""The node executor: one per node; runs the replicas the log places there and reports on them.

- `python -m services.executor --nats URL --node NAME --pool POOL [--gpus N] [--data-dir DIR]
  [--runtime process|docker] [--hollow]` runs one (see `__main__`).
- In-process: `await services.executor.service.Executor(eventlog, ExecutorConfig(...)).run()`,
  or `ExecutorGroup` for many (hollow) executors on one connection and one fold.
- `runtime` starts and adopts replicas (processes through `shim`; hollow ones), `docker` as
  containers, `gpus` discovers GPUs, `workload` is the built-in training-like workload; the
  rest is listed in `service`.

This package imports nothing on purpose: the shim and the built-in workload run as
`python -m services.executor.<module>` for every replica and should start fast.
"""
