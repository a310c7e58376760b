# Sourced by the scripts/h200_*.sh device scripts (run on the lent GPU, the wheel built here carried in dist/):
# sets OUT, ROOT (the repo root), rc, the step / pyt helpers, prints the GPU and installs the newest
# dist/tsct-*.whl (no deps, no index; exits 3 if that fails).
#   step NAME SECONDS CMD...   run CMD in /tmp under a timeout, log to $OUT/NAME.log, show its last $TAIL lines;
#                              a failing step sets rc=1 (the script's exit status: `exit $rc`)
#   pyt ARGS...                pytest, quiet, no cache, rooted at /tmp (the repo's conftest is not imported)
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset PYTHONPATH TSCT_TRITON_BACKEND TSCT_TRITON_GLU_CFG
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repo root, wherever the script is run from
rc=0
step() {
  local name=$1 t=$2; shift 2
  echo "== $name ($(date +%T))"
  (cd /tmp && timeout --kill-after=10 "$t" "$@") 2>&1 | tee "$OUT/$name.log" | tail -n "${TAIL:-25}"
  local r=${PIPESTATUS[0]}
  echo "== $name: rc=$r"
  [[ $r == 0 ]] || rc=1
}
pyt() { python3 -m pytest -q -p no:cacheprovider --tb=short -rfEs --rootdir=/tmp "$@"; }
export -f pyt
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
whl=$(ls -t "$ROOT"/dist/tsct-*.whl | head -n 1)
python3 -m pip install --no-deps --no-index --force-reinstall "$whl" >"$OUT/install.log" 2>&1 \
  || { tail -n 20 "$OUT/install.log"; exit 3; }
