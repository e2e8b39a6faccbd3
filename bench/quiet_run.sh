#!/usr/bin/env bash
# The speed targets of issues 25 and 30, this checkout beside a base tree, on a machine of its own.
#
#   bash bench/quiet_run.sh BASE_TREE [CPUS]      e.g. bash bench/quiet_run.sh .quiet-base 0,1
#
# The project's own machine is a shared 2-core VM whose load swings from 0 to 5 within minutes,
# which moves every ratio below by tens of percent. This runs the same benchmarks where nothing
# else runs (the lent GPU machine's CPUs), pinned to CPUS (default 0,1: the two cores the
# numbers in bench/RESULTS.md were taken on), each side built from source with the machine's own
# compiler into a --target folder: this checkout (new) and BASE_TREE (base, e.g. `git archive`
# of the previous main). Logs go to /tmp/quiet-logs, packed at the end into $OUT/quiet-logs.tgz
# ($OUT default /tmp/quiet-out); each log's last lines are printed. QUIET_N (default 1e8) sizes
# the packing and weighted runs, QUIET_ROUNDS (default 21) the iteration rounds; QUIET_PARTS
# (default "packing weighted gaps") picks the runs.
set -uo pipefail
BASE=$(cd "$1" && pwd)
CPUS=${2:-0,1}
R=$(pwd)
OUT=${OUT:-/tmp/quiet-out}
LOG=/tmp/quiet-logs
N=${QUIET_N:-1e8}
ROUNDS=${QUIET_ROUNDS:-21}
PARTS=${QUIET_PARTS:-packing weighted gaps}
mkdir -p "$OUT" "$LOG"
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/t-new "$R" >"$LOG/build-new.log" 2>&1 &
(cd "$BASE" && python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/t-base . >"$LOG/build-base.log" 2>&1) &
wait
printf '#!/bin/sh\nPYTHONPATH=/tmp/t-base exec python3 "$@"\n' >/tmp/py-base
printf '#!/bin/sh\nPYTHONPATH=/tmp/t-new exec python3 "$@"\n' >/tmp/py-new
chmod +x /tmp/py-base /tmp/py-new
cd /tmp
for py in new base; do  # each side must import its own build (an editable install would win)
  /tmp/py-$py -c "import fastshard, sys; f = fastshard.__file__; print('$py', f); sys.exit(not f.startswith('/tmp/t-$py/'))" || exit 1
done
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee "$LOG/cpu.txt"
run() {  # run NAME CMD...: pinned, logged, its last lines shown
  local name=$1
  shift
  taskset -c "$CPUS" "$@" >"$LOG/$name.log" 2>&1
  echo "rc=$?" >>"$LOG/$name.log"
  echo "== $name"
  tail -n 4 "$LOG/$name.log" | cut -c1-400
}
nn=$(python3 -c "print(int(float('$N')))")
/tmp/py-new -c "import sys; sys.path.insert(0, '$R/bench'); import packing, pathlib; packing.pretrain_lengths($nn, pathlib.Path('/tmp/pretrain_$nn.u32'))"
case " $PARTS " in *" packing "*)
  run packing /tmp/py-new "$R/bench/packing.py" megatron --n "$N" --repeat 3 --dir /tmp --base-python /tmp/py-base ;;
esac
case " $PARTS " in *" weighted "*)
  for side in new base; do
    run "weighted-$side" /tmp/py-$side "$R/bench/weighted.py" --n "$N" --repeat 5 --first-calls 1
  done ;;
esac
case " $PARTS " in *" gaps "*)
  for k in 1 2; do
    for side in new base; do
      run "iterate-$side-$k" /tmp/py-$side "$R/bench/iterate_gap.py" "$ROUNDS"
      run "mixture-$side-$k" /tmp/py-$side "$R/bench/mixture_gap.py"
    done
  done ;;
esac
tar czf "$OUT/quiet-logs.tgz" -C "$LOG" .
