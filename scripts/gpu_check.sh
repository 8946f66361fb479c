#!/usr/bin/env bash
# The checks a lent GPU machine runs, as one script, in under 8 minutes (each step has its own
# timeout): the `gpu`-marked tests (CUDA IPC hand-off, FSDP2 over NCCL at world size 1, and 2 or
# the end-to-end runs where there are enough GPUs), then the GPU benches. Prints everything; exits
# non-zero when the tests fail.
#
#     bash scripts/gpu_check.sh            # from the repository root, torch with CUDA installed
set -u
cd "$(dirname "$0")/.."
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
RANKS=1
[ "$GPUS" -ge 2 ] && RANKS=1,2

echo "== gpu tests"
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/
status=$?

echo "== bench_trainer (bf16, FSDP2 for 2 ranks)"
timeout 150 python scripts/bench_trainer.py --device cuda --ranks "$RANKS" --hidden 1024 --layers 8 \
    --heads 16 --seqs 64 --mean-len 256 --budget 8192 --rounds 3 --steps 3

echo "== bench_weights"
timeout 60 python scripts/bench_weights.py --sizes-mb 100,1024 --rounds 3
exit $status
