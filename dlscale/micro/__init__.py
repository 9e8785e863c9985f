"""Micro-benchmarks: matmul, memory bandwidth, one transformer layer, collectives.

Each kind has a plain Python API returning rows (list of dicts) and a ``dlscale micro KIND``
subcommand that prints a table and appends one record of kind "micro" to the result store.

* ``dlscale.micro.matmul.run_matmul(shapes, dtypes, device, warmup, iters)``
* ``dlscale.micro.bandwidth.run_bandwidth(sizes, ops, device, warmup, iters)``
* ``dlscale.micro.layer.run_layer(LayerCase(kind, size, batches, seqs, precision), device, Timing(warmup, iters))``
* ``dlscale.micro.comm.run_comm(CommSweep(ops, min_bytes, max_bytes, factor, dtype), nproc, device, ...)``
  (spawns torchrun), or ``dlscale.micro.comm_worker.run_collectives(...)`` inside an initialised
  process group.
* ``dlscale.micro.io.measure_pipeline(PipelineCase(pipeline, data, workers, batch), seconds, device)``

Formulas and record layout: docs/micro.md.
"""
