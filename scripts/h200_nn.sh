#!/usr/bin/env bash
# Device script for tsct.nn: the expert layers' GPU tests and the training A/B of examples/train_moe_lm.py.
# Runs from the repo root with the wheel built on the CPU machine carried in dist/:
#
#   bash scripts/h200_nn.sh                                  # on the GPU machine with dist/ carried; about 8 minutes
#   STAGES=train TRAIN_STEPS=800 bash scripts/h200_nn.sh     # the training A/B only, 800 steps (about 4 minutes)
#   STAGES=ep bash scripts/h200_nn.sh                        # on a 2-GPU machine: EP and FSDP2 over NCCL
#
# Stages (STAGES, space-separated; default "tests train"):
#   tests   tests/gpu/test_nn_experts_gpu.py: the layers on the kernel paths against the fp32 padded bmm, the
#           straight-through layers, make_graphed_callables, torch.compile, the counts interface without host syncs
#   train   examples/train_moe_lm.py (GPU preset: six arms; TRAIN_STEPS steps, else steps fitted to TRAIN_BUDGET
#           seconds) -> $OUT/
#           <date>_<gpu>_moe-lm_<commit>.json, and .png when matplotlib is installed (else draw it later:
#           python examples/train_moe_lm.py --plot FILE.json)
#   ep      tests/gpu/test_nn_parallel_gpu.py (needs 2 GPUs)
# Exit status: 1 if a stage failed (the training stage fails when tsct-bf16 misses the 1 % gate: its validation loss
# and gradients against the exact layer's on its own trajectory).
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
STAGES=${STAGES:-"tests train"}
TRAIN_BUDGET=${TRAIN_BUDGET:-220}
TRAIN_STEPS=${TRAIN_STEPS:-}
if [ -n "$TRAIN_STEPS" ]; then train_len=(--time-budget 0 --steps "$TRAIN_STEPS"); else train_len=(--time-budget "$TRAIN_BUDGET"); fi
for s in $STAGES; do
  case $s in
    tests) step nn_tests 300 env PYTHONPATH="$ROOT/tests" \
             bash -c "pyt --durations=8 $ROOT/tests/gpu/test_nn_experts_gpu.py" ;;
    train) step train_moe_lm $((TRAIN_BUDGET + 150)) python3 "$ROOT/examples/train_moe_lm.py" --preset gpu \
             "${train_len[@]}" --out "$OUT" --require-gate ;;
    ep) step nn_parallel 420 env PYTHONPATH="$ROOT/tests" bash -c "pyt $ROOT/tests/gpu/test_nn_parallel_gpu.py" ;;
    *) echo "unknown stage $s (tests, train, ep)"; rc=1 ;;
  esac
done
exit $rc
