#!/usr/bin/env bash
# First, once, from the repository root: pip install ".[all,cuda,test]"   (or pass --install)
#
# Every GPU measurement of this project in one prepared run of at most 8 minutes:
#
#     benchmarks/gpu.sh [--install] [--smoke-cpu] [--budget SECONDS] [--out DIR] [--only P,P]
#                       [--limit P=SECONDS,...]
#     benchmarks/gpu.sh --merge LATER/bench_gpu.json [--out DIR]
#
# On a machine whose JAX sees an NVIDIA GPU it prints the device, then runs, each part in
# processes of its own under a time limit (benchmarks/gpu.py does the work):
#
#   bench          cvae bench, every implementation and path, batch 1 and 4096: step time and
#                  ratio to pure JAX, compile time (trace, lower, compile), per-call overhead (an
#                  empty step), the epoch as one call, FLOPs against an 8192 matmul roof, pure
#                  JAX's data-parallel mechanisms on the devices present
#   bf16           benchmarks/step_time.py: float32 against bfloat16, batch 4096 and 256
#   dispatch       benchmarks/dispatch.py: what one call costs at batch 1 (loop, scan, identity)
#   data_parallel  benchmarks/data_parallel.py: every implementation and mechanism, devices present
#   roof           benchmarks/roof_gap.py: pure JAX's step and its parts against the roof
#   bench_2        cvae bench again at batch 8 and 256, merged into the same file
#   bench_3        cvae bench again at batch 64 and 1024, merged into the same file
#   suite          the conformance suite on the GPU, every implementation (see below)
#
# and writes, into --out, else $GPU_BENCH_OUT, else $OUT, else benchmarks/results/:
# bench_gpu.json (the cvae bench figures, and under "gpu_run" the device, the versions and every
# part's outcome: ok, failed, timed out, partial or skipped), step_time_gpu.json,
# dispatch_gpu.json, data_parallel_gpu.json, roof_gap_gpu.json, and gpu_logs/ beside them
# (runs/gpu_logs/ when they go to benchmarks/results/): each process's output, the suite's JSON
# reports. A part that fails or runs out of time is recorded as such and
# the next one runs. Then `python benchmarks/render.py` puts the figures on docs/performance.md and
# docs/choosing.md beside the CPU ones.
#
# Without a GPU it says so in one line and exits with status 2. --smoke-cpu runs every part on the
# CPU at toy sizes into a temporary folder (or --out), files named *_smoke.json: a check that the
# script still works (tests/test_gpu_script.py runs it), no figure of it means anything.
#
# The time budget (8 minutes on one H200 with 16 host cores; no compile time measured there yet).
# gpu.py stops at 450 s from its start; every part has a limit, shrunk to what is left; the suite
# comes last, so that it takes whatever the benchmarks leave (at least 120 s are kept for it):
#
#   preflight       ~10 s     JAX starting on the GPU once, versions, nvidia-smi
#   bench           <=90 s    ~24 programs compiled per batch size (5 fast paths, 5 empty steps,
#                             5 scans, NNX's and Equinox's own paths, twice the cleared ones, the
#                             roofs); on two CPU cores each takes 1.2-1.8 s
#                             (benchmarks/results/bench_cpu.json): ~25-30 s a batch size, 2 batch
#                             sizes, starting JAX and five frameworks, the data-parallel cases.
#                             cvae bench writes its file at the end only, so it runs as three
#                             runs of two batch sizes: one stopped by its limit loses only its own
#   bf16            <=60 s    9 paths x 2 dtypes x 2 batch sizes, one compile each (~40 s);
#                             written after each, 4096 first: stopped early, it keeps whole pairs
#   dispatch        <=35 s    6 fast paths x (step, scan, identity) at batch 1
#   data_parallel   <=40 s    5 implementations x (serial + pmap, sharded, shard_map) per count
#   roof            <=35 s    11 programs of pure JAX's step and its parts, one process
#   bench_2         <=70 s    batch 8 and 256    } each only as far as the suite keeps its 120 s
#   bench_3         <=70 s    batch 64 and 1024  }
#   suite          <=330 s    the rest of the 450 s
#
# The suite: one passing implementation takes ~200 s on two CPU cores cold
# (benchmarks/results/suite_cost_cpu.json), of which its precision and bfloat16 checks
# (test_precision, 12 checks on the 784-pixel model in float32 and bfloat16) ~50 s of CPU time; the
# pairwise checks of five implementations are 90 more. Five implementations one after the other
# would take ~17 minutes; so they run side by side, one process per implementation for
# test_precision, one per implementation for every other check and one for the pairs: 11 processes
# on 16 cores, each session's memory not preallocated (XLA_PYTHON_CLIENT_PREALLOCATE=false). Its
# precision and bfloat16 sessions are the short ones (they fit the time by a wide margin); the
# other checks and the pairs end when the time does, interrupted with SIGINT so that pytest still
# writes its report, whose counts then say how far each got (the figures are recorded per
# implementation: passed, failed, skipped, whether every check was reached, the first failure). The suite sets float32 matmuls to
# "highest" precision for its own checks and runs its default hypothesis profile (ci).
#
# Options: --install runs pip install ".[all,cuda,test]" first (not counted in the budget);
# --budget SECONDS changes the 450 s; --only bench,suite runs those parts alone; --limit
# bench=240,roof=60 replaces those parts' limits (still within the budget); --merge FILE runs
# nothing and folds FILE, the bench_gpu.json of a later run of some parts (--only ... --out
# elsewhere), into --out's bench_gpu.json, the later run's parts replacing the earlier's and marked
# with their run; the environment variable PYTHON names the interpreter (default python3, or
# python where there is no python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-$(command -v python3 || command -v python)}"

args=()
install=0
for arg in "$@"; do
    case "$arg" in
        --install) install=1 ;;
        *) args+=("$arg") ;;
    esac
done

if [[ "$install" == 1 ]]; then
    echo "pip install \"$root[all,cuda,test]\""
    "$python" -m pip install --quiet "$root[all,cuda,test]"
fi

exec "$python" "$here/gpu.py" ${args[@]+"${args[@]}"}
