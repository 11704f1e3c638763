#!/usr/bin/env bash
# METG(50%) of the task_bench example (examples/task_bench.rs), per pattern, on one placement
# (SUB workers unless WORKERS says otherwise), as task-bench's scripts/chart_metg.py computes
# it (see /work/shared/taskbench/SPEC.md, section 7).
#
#   benches/task_bench_metg.sh [PATTERN...]      (default: all six patterns)
#
# For each pattern: a sweep of -kernel compute_bound over I = 2^(26-s), s = S_FIRST..S_LAST,
# min(s+1, 5) runs at step s, T = STEPS, W = WIDTH; then E = the mean elapsed time of the runs
# at each I, g = E * CORES / tasks (us of core time per task), e = (FLOPs / E) / peak with peak
# the best single run of the sweep (or PEAK); METG = the smallest g with e >= 0.5, interpolated linearly
# in (e, g) with the next smaller I. Then EMPTY_REPS runs of -kernel empty give the wall time
# per task (median). The METG of the min and of the median E are printed too. Figures:
#
#   figure metg_<pattern>_w<W>_us <value> us
#   figure task_bench_empty_us_per_task_<pattern> <value> us
#
# Environment: WIDTH (2), STEPS (1000), CORES (WIDTH; the C of g = E*n*C/N), WORKERS (sub:
# where tasks run, the example's --workers sub|chips|l4|remote), SUB_WORKERS (CORES: the
# example's -worker N, the workers that run tasks: SUB workers, chips, or SUB workers over both
# L3 Workers; a number in WORKERS, what it meant before, is taken as SUB_WORKERS), S_FIRST (0)
# and S_LAST (18): the sweep (the full one takes minutes per pattern at s = 0: a task of 2^26
# iterations runs for about 0.2 s), EMPTY_REPS (5), NO_BUILD=1 to use the binary already
# built, BIN (the binary to run, target/release/examples/task_bench unless set: another build,
# run as it is, nothing built;
# to compare two side by side) and PEAK (FLOP/s: the peak e is measured against, instead of the
# sweep's best run; two builds compared with one PEAK are measured on one scale, since a build
# slower at large grain otherwise looks more efficient at small grain), FLAGS (more flags for
# every run, e.g. --no-bind).
set -euo pipefail
# A BIN given relative to the caller's directory, before the cd.
if [ -n "${BIN:-}" ]; then
  BIN=$(realpath "$BIN")
fi
cd "$(dirname "$0")/.."

WIDTH=${WIDTH:-2}
STEPS=${STEPS:-1000}
CORES=${CORES:-$WIDTH}
WORKERS=${WORKERS:-sub}
if [[ $WORKERS =~ ^[0-9]+$ ]]; then
  SUB_WORKERS=${SUB_WORKERS:-$WORKERS}
  WORKERS=sub
fi
SUB_WORKERS=${SUB_WORKERS:-$CORES}
S_FIRST=${S_FIRST:-0}
S_LAST=${S_LAST:-18}
EMPTY_REPS=${EMPTY_REPS:-5}
# Another build given as BIN is run as it is: nothing is built.
if [ -n "${BIN:-}" ]; then NO_BUILD=1; fi
BIN=${BIN:-target/release/examples/task_bench}

if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --quiet --release -p simpler-examples --example task_bench
fi
patterns=("$@")
[ ${#patterns[@]} -gt 0 ] || patterns=(trivial no_comm stencil_1d fft tree all_to_all)

echo "task_bench METG: W=$WIDTH T=$STEPS cores=$CORES workers=$WORKERS x $SUB_WORKERS s=$S_FIRST..$S_LAST bin=$BIN${FLAGS:+ $FLAGS} peak=${PEAK:-best run} ($(nproc) CPUs, load:$(uptime | sed 's/.*load average://'))"

# One run: prints "<elapsed seconds> <total FLOPs> <total tasks>"; a failed run stops the script.
run() {
  # shellcheck disable=SC2086 # FLAGS is a list of flags
  "$BIN" -steps "$STEPS" -width "$WIDTH" --workers "$WORKERS" -worker "$SUB_WORKERS" ${FLAGS:-} "$@" | awk '
    /^Total Tasks / { n = $3 }
    /^Total FLOPs / { f = $3 }
    /^Elapsed Time / { e = $3 }
    END { if (n == "" || e == "") exit 1; print e, f, n }'
}

for pattern in "${patterns[@]}"; do
  data=$(mktemp)
  for ((s = S_FIRST; s <= S_LAST; s++)); do
    iter=$((1 << (26 - s)))
    reps=$((s + 1 < 5 ? s + 1 : 5))
    for ((r = 0; r < reps; r++)); do
      echo "$s $iter $(run -type "$pattern" -kernel compute_bound -iter "$iter")" >>"$data"
    done
  done
  empty=$(for ((r = 0; r < EMPTY_REPS; r++)); do run -type "$pattern" -kernel empty; done)

  echo "--- $pattern"
  sort -n -k1,1 -k3,3g "$data" | awk -v cores="$CORES" -v pattern="$pattern" -v width="$WIDTH" -v fixed_peak="${PEAK:-0}" '
    # Fields: s iter elapsed flops tasks (one line per run, sorted by s then elapsed).
    {
      if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1; iter[$1] = $2; n[$1] = $5; f[$1] = $4 }
      runs[$1, ++cnt[$1]] = $3; sum[$1] += $3
      rate = $4 / $3; if (rate > peak) peak = rate
    }
    # METG over the points 1..k (decreasing iter) of E[]: sets g[] and e[], returns the value
    # (-1 when no point reaches 50%); warns as chart_metg.py checks when `loud`.
    function metg(E, loud,    j, s, above, below, best) {
      if (fixed_peak > 0) peak = fixed_peak
      above = below = 0
      for (j = 1; j <= k; j++) {
        s = order[j]
        g[j] = E[j] * cores / n[s] * 1e6
        e[j] = (f[s] / E[j]) / peak
        if (e[j] >= 0.5) above = 1; else below = 1
        if (loud && e[j] > 1.5) printf "  warning: efficiency %.3f > 1.5 at iter %d\n", e[j], iter[s]
      }
      if (loud && (!above || !below)) print "  warning: no point on one side of 50% efficiency: widen the sweep (S_FIRST, S_LAST)"
      best = 0
      for (j = 1; j <= k; j++) if (e[j] >= 0.5 && (best == 0 || g[j] < g[best])) best = j
      if (best == 0) return -1
      if (best == k) { if (loud) print "  warning: no point after the chosen one: extend S_LAST"; return g[best] }
      if (g[best + 1] < g[best])
        return g[best + 1] + (0.5 - e[best + 1]) * (g[best] - g[best + 1]) / (e[best] - e[best + 1])
      return g[best]
    }
    END {
      for (j = 1; j <= k; j++) {
        s = order[j]; c = cnt[s]
        mean[j] = sum[s] / c; lo[j] = runs[s, 1]
        med[j] = (c % 2) ? runs[s, (c + 1) / 2] : (runs[s, c / 2] + runs[s, c / 2 + 1]) / 2
      }
      by_min = metg(lo, 0); by_median = metg(med, 0); by_mean = metg(mean, 1)
      printf "  %10s %4s %12s %12s %12s %12s %8s\n", "iter", "runs", "mean s", "min s", "median s", "g us", "eff"
      for (j = 1; j <= k; j++)
        printf "  %10d %4d %12.6f %12.6f %12.6f %12.3f %8.3f\n", iter[order[j]], cnt[order[j]], mean[j], lo[j], med[j], g[j], e[j]
      printf "  peak %.4e FLOP/s (%s); METG from the min E %.3f us, from the median E %.3f us\n", peak, (fixed_peak > 0 ? "PEAK, fixed" : "best single run"), by_min, by_median
      if (by_mean < 0) { print "  no point reaches 50% efficiency"; exit }
      printf "figure metg_%s_w%d_us %.3f us\n", pattern, width, by_mean
    }'
  echo "$empty" | awk -v pattern="$pattern" '
    { v[++k] = $1 / $3 * 1e6 }
    END {
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      med = (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
      printf "  empty kernel: %d runs, wall per task min %.3f median %.3f us\n", k, v[1], med
      printf "figure task_bench_empty_us_per_task_%s %.3f us\n", pattern, med
    }'
  rm -f "$data"
done
