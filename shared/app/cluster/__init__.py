"""A run of several processes: ``jax.distributed`` and a launcher for trying it on one machine.

``cvae train --distributed --coordinator HOST:PORT --num-processes P --process-id I`` joins process
``I`` of ``P`` to the run; process 0 hosts the coordinator at ``HOST:PORT``. Every process builds
the same global mesh over all processes' devices, computes the same shuffled epoch, and puts only
its own rows of each global batch on its own devices (``RunDevices.place_epoch``), so the step is
the single-process ``sharded`` or ``shard_map`` step over a bigger mesh. Only process 0 writes
outputs.
On CPU, collectives go through gloo, and each process arranges ``devices / P`` host devices.

- :mod:`~cvae_rosetta.app.cluster.membership`: where this process stands among the others, given
  by the flags or found in a scheduler's environment (SLURM, Open MPI), and how the processes join,
  agree and go on (:class:`~cvae_rosetta.app.cluster.membership.Cluster`).
- :mod:`~cvae_rosetta.app.cluster.lost`: a process that dies during the run, and the one line the
  others say before they end.
- :mod:`~cvae_rosetta.app.cluster.launch`: ``cvae launch``, which starts the processes of a run on
  loopback, forwards their output and stops them.
"""
