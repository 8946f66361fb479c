#!/usr/bin/env bash
# The proof a GPU machine gives in its first minutes, in under 8 minutes on one GPU, with no package
# index: install from a wheelhouse (scripts/wheelhouse.sh, made where there is package access), then
# each step under its own timeout (and all under one deadline), every figure into one JSON file, and
# the README's performance rows printed, dated.
#
#     bash scripts/gpu_check.sh [--wheelhouse DIR] [--out FILE]     # from anywhere; torch with CUDA
#     bash scripts/gpu_check.sh [--wheelhouse DIR] --install-only SITE   # the install alone, any torch
#
# - Machine: `python3` (or $PYTHON) must import a CUDA torch that sees a device; else one line, exit 2
#   (before anything is installed).
# - Install: the wheelhouse (default: wheelhouse/ in the checkout) goes into a fresh --target folder
#   with `pip install --no-index --no-deps`, put first on PYTHONPATH; the machine's torch and its
#   site-packages are never written to. `gpu_check.py deps` then checks that every installed wheel's
#   requirements are met (the wheelhouse leaves numpy and pyarrow to the image): unmet, exit 2.
# - Steps (limit in seconds; a step past the deadline is cut short or skipped):
#   gpu-tests 120: `pytest -m gpu` over the files that carry the marker (CUDA IPC, trainer ranks on
#     GPUs; vLLM's skip without vLLM);
#   default-job 75: `python -m orchestrator.launch` from a directory outside the checkout, so the
#     installed package and its shipped default config run, torch inference on GPU 0 (the trainer on
#     GPU 1 where there is one, else beside inference on GPU 0 with actor.colocate=true: weights
#     over CUDA IPC either way), 120 steps;
#   bench-weights 75: CUDA IPC reload of a random 1.5B-parameter bf16 model vs a device-to-device copy;
#   bench-trainer 75: tokens/s and MFU in bf16 (1 rank; 1 and 2 with two GPUs);
#   bench-pipeline 100: the default job's model, async (S=2) vs sync, torch inference on GPU 0.
# - Output: logs and figures under runs/gpu_check/ (--out: the JSON file, default
#   runs/gpu_check/gpu_check.json). Exit 0 when every step passed, 1 otherwise.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
TOTAL_S=450                                     # + the report: inside 8 minutes with margin
START=$(date +%s)

die() { echo "gpu_check: $1" >&2; exit 2; }

wheelhouse="$ROOT/wheelhouse" out="" install_only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --wheelhouse) [ $# -ge 2 ] || die "--wheelhouse needs a folder"; wheelhouse="$2"; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a file name"; out="$2"; shift 2 ;;
        --install-only) [ $# -ge 2 ] || die "--install-only needs a new folder"; install_only="$2"; shift 2 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

if [ -z "$install_only" ]; then
    machine=$("$PY" "$ROOT/scripts/gpu_check.py" probe) || exit 2
fi
[ -d "$wheelhouse" ] && ls "$wheelhouse"/*.whl >/dev/null 2>&1 \
    || die "no wheelhouse at $wheelhouse: make one with scripts/wheelhouse.sh DIR where pip reaches an index, bring it, pass --wheelhouse DIR"
wheelhouse="$(cd "$wheelhouse" && pwd)"

# install: the wheelhouse into a new --target folder, then its requirements checked against this machine
install() {
    local site="$1"
    echo "== install $(ls "$wheelhouse"/*.whl | wc -l) wheels from $wheelhouse into $site"
    timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$site" "$wheelhouse"/*.whl \
        || die "installing the wheelhouse failed (above)"
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$ROOT/scripts/gpu_check.py" deps "$site" || exit 2
}
if [ -n "$install_only" ]; then
    [ ! -e "$install_only" ] || [ -z "$(ls -A "$install_only")" ] || die "$install_only is not empty"
    install "$install_only"
    exit 0
fi
logdir="$ROOT/runs/gpu_check"
rm -rf "$logdir" && mkdir -p "$logdir" || die "cannot write $logdir"
out="${out:-$logdir/gpu_check.json}"
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
echo "== $(date -u +%FT%TZ) $machine"
echo "$gpus x $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))'), torch $("$PY" -c 'import torch; print(torch.__version__)')" \
    > "$logdir/machine.txt"

site="$(mktemp -d)/site"
install "$site"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

# step NAME LIMIT CMD...: runs CMD under min(LIMIT, time left), output to the console and NAME.log
step() {
    local name="$1" limit="$2" left rc t0; shift 2
    left=$((START + TOTAL_S - $(date +%s)))
    [ "$left" -lt "$limit" ] && limit="$left"
    if [ "$limit" -lt 10 ]; then
        echo "== $name: skipped, out of time"; printf '%s\t%s\t%s\t%s\n' "$name" 99 0 0 >> "$logdir/steps.tsv"
        return
    fi
    echo "== $name (at most ${limit}s)"
    t0=$(date +%s%N)
    timeout --kill-after=10 "$limit" "$@" > >(tee "$logdir/$name.log") 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')" "$limit" >> "$logdir/steps.tsv"
    [ "$rc" = 0 ] || echo "== $name: exit $rc$([ "$rc" = 124 ] && echo ' (timed out)')"
}

cd "$ROOT"
mapfile -t gpu_files < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
step gpu-tests 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider "${gpu_files[@]}"
cp "$logdir/gpu-tests.log" "$logdir/gpu_tests.log" 2>/dev/null

job_args=("inference.devices=['0']")
if [ "$gpus" -ge 2 ]; then job_args+=("actor.device=1"); else job_args+=("actor.device=0" "actor.colocate=true"); fi
echo "${job_args[*]}" > "$logdir/default_job.args"
jobdir="$(mktemp -d)"                          # outside the checkout: the installed package runs
step default-job 75 bash -c 'cd "$1" && shift && exec "$@"' _ "$jobdir" "$PY" -m orchestrator.launch \
    "run.dir=$logdir/default_job" run.total_steps=120 run.progress=false "${job_args[@]}"

step bench-weights 75 "$PY" scripts/bench_weights.py --sizes-mb 1024 --skip-create --rounds 3 \
    --cuda-params 1.5e9 --json "$logdir/bench_weights.json"

ranks=1
[ "$gpus" -ge 2 ] && ranks=1,2
step bench-trainer 75 "$PY" scripts/bench_trainer.py --device cuda --ranks "$ranks" --hidden 1024 \
    --layers 8 --heads 16 --seqs 64 --mean-len 256 --budget 8192 --rounds 3 --steps 3 \
    --json "$logdir/bench_trainer.json"

step bench-pipeline 100 "$PY" scripts/bench_pipeline.py --backend torch --rounds 1 --steps 40 \
    --json "$logdir/bench_pipeline.json" "inference.devices=['0']"

echo "== figures: $out ($(( $(date +%s) - START )) s in all); README rows:"
"$PY" scripts/gpu_check.py report "$logdir" "$out" "$(date +%F)"
awk -F'\t' '$2 != 0 {bad = 1} END {exit bad}' "$logdir/steps.tsv"
