#!/usr/bin/env bash
# The GPU's figures: the CPU's harness (cvae bench) with GPU-sized parts, and the conformance suite
# on the device, each in a call of its own, both inside one 15-minute device session.
#
#     benchmarks/gpu.sh bench [--out DIR] [cvae bench flags]   # at most 7 minutes on one H200
#     benchmarks/gpu.sh suite [--out DIR]                      # about 5 minutes
#     benchmarks/gpu.sh smoke [--out DIR]                      # both on the CPU, toy sizes
#
# First, once, from the repository root: pip install ".[all,cuda,test]". Without a GPU (bench,
# suite) it says so in one line and exits with status 2.
#
# bench: cvae bench at batch 1, 256, 4096 and 32768 (the roof a 8192 matmul beside the streaming
#   bandwidth, bfloat16 and pure JAX's step variants at 4096, the data-parallel mechanisms on the
#   devices present), killed at BENCH_LIMIT seconds (420): the last H200 run measured batch 1 and
#   4096 with every path but Keras in 120 s; four batch sizes, Keras and the variants have not run
#   on a GPU yet, so the limit leaves the suite its 280 s in a 15-minute lending and no more. It writes DIR/bench.json (default benchmarks/results/gpu/);
#   copy it to benchmarks/results/bench_gpu.json and run python benchmarks/render.py.
# suite: every implementation's conformance suite side by side, one pytest per implementation,
#   each stopped with SIGINT at SUITE_LIMIT seconds (280) so that it still writes its report
#   (DIR/conformance-IMPL.json, its log beside it); the counts then say how far each got.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$(command -v python3 || command -v python)}"
part="${1:-}"
shift || true
out="$root/benchmarks/results/gpu"
if [[ "${1:-}" == "--out" ]]; then out="$2"; shift 2; fi
mkdir -p "$out"

case "$part" in
    bench|suite|smoke) ;;
    *) echo "benchmarks/gpu.sh: expected a part (bench, suite or smoke), got '${part}'"; exit 2 ;;
esac
if [[ "$part" != smoke ]] && ! "$python" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null; then
    echo "benchmarks/gpu.sh: expected a GPU that JAX sees, got backend $("$python" -c 'import jax; print(jax.default_backend())' 2>/dev/null || echo '(jax not importable)')"
    exit 2
fi

bench() {  # the part's time limit, then cvae bench's flags
    timeout --signal=INT --kill-after=10 "$1" "$python" -m cvae_rosetta bench --out "$out" \
        --overwrite --no-progress "${@:2}"
}

suite() {  # the time limit, pytest's own arguments, then the implementations, side by side
    local limit=$1 selection=$2 status=0
    shift 2
    for impl in "$@"; do
        # shellcheck disable=SC2086
        timeout --signal=INT --kill-after=20 "$limit" "$python" -m pytest -q -p no:cacheprovider \
            --pyargs cvae_rosetta.conformance $selection --impl "$impl" \
            --conformance-report "$out/conformance-$impl.json" >"$out/conformance-$impl.log" 2>&1 &
    done
    for job in $(jobs -p); do wait "$job" || status=$?; done
    tail -n 1 "$out"/conformance-*.log
    return "$status"
}

case "$part" in
    bench)
        bench "${BENCH_LIMIT:-420}" --batch-sizes 1,256,4096,32768 --roof-size 8192 \
            --precision-batches 4096 --technique-batches 4096 --devices 1 \
            --epoch-examples 65536 "$@" ;;
    suite)
        suite "${SUITE_LIMIT:-280}" "" $("$python" -c 'from cvae_rosetta.spec import protocol
print(" ".join(i.name for i in protocol.known() if i.installed))') ;;
    smoke)
        export JAX_PLATFORMS=cpu
        bench 600 --impls pure_jax --batch-sizes 2 --rounds 5 --steps 8 --unrolls 1 --devices 1 \
            --mechanisms sharded --parallel-batch 4 --roof-size 64 --precision-batches 2 \
            --technique-batches none --epoch-examples 16 "$@"
        suite 300 "-k init" pure_jax ;;
esac
