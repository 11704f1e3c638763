#!/usr/bin/env bash
# The OpenCL chip checks on a GPU machine that has a GPU driver but no Rust toolchain and no
# network: the OpenCL backend's test suites, examples and benchmark, as CI runs them on PoCL.
#
#   benches/gpu_check.sh prepare [DIR]   on a machine with the toolchain: builds the OpenCL test
#                                        suites, the two OpenCL examples and the `opencl`
#                                        benchmark, stripped, with this machine's ICD loader
#                                        (libOpenCL.so.1, in case the GPU machine lacks one),
#                                        into DIR/gpu_check.tar.gz (about 20 MB; DIR is
#                                        `.device` unless given, and is added to
#                                        .git/info/exclude, so a tool that copies the working
#                                        tree carries it only when told to)
#   benches/gpu_check.sh run [DIR]       on the GPU machine, from the repository root: unpacks
#                                        them, finds the OpenCL loader and drivers, lists the
#                                        devices, runs every suite (SIMPLER_REQUIRE_OPENCL=1: no
#                                        device is a failure, not a skip), the examples and the
#                                        benchmark; writes each step's log to $OUT (or
#                                        DIR/logs) and prints a line per step
#
# The binaries are linked against this machine's glibc, so the GPU machine's must be as new
# (Debian 12's 2.36 or later). `run` goes on past a failed step and exits non-zero if any
# failed. The benchmark's `figure` lines end its output (all of it in `opencl_bench.log`).
set -uo pipefail
cd "$(dirname "$0")/.."

what=${1:-}
DIR=${2:-.device}
SUITES=(opencl chips_opencl timeline_opencl tiles_opencl device_intermediates_opencl l2_worker_opencl)

prepare() {
  set -e
  mkdir -p "$DIR"
  case $DIR in
    /*) ;;
    *)
      # (`git rev-parse`: in a worktree `.git` is a file.)
      local exclude
      exclude=$(git rev-parse --git-path info/exclude)
      mkdir -p "$(dirname "$exclude")"
      grep -qxF "/$DIR/" "$exclude" 2>/dev/null || echo "/$DIR/" >>"$exclude"
      ;;
  esac
  local stage
  stage=$(mktemp -d)
  mkdir "$stage/bin"
  # The test suites and examples as `cargo test` and `cargo run` build them (stripped below),
  # the benchmark in its own (optimized) profile.
  local tests=()
  for s in "${SUITES[@]}"; do tests+=(--test "$s"); done
  local json=$stage/artifacts.json
  cargo test --locked --no-run --message-format=json -p simpler-tests --features opencl "${tests[@]}" >"$json"
  cargo test --locked --no-run --message-format=json -p simpler-rt --features opencl --lib >>"$json"
  cargo bench --locked --no-run --message-format=json -p simpler-benches --features opencl --bench opencl >>"$json"
  cargo build --locked --message-format=json -p simpler-examples --features opencl \
    --example tiled_matmul --example opencl_vector_add >>"$json"
  # Each executable under a name of its kind: a test suite or an example by its own name, the
  # library's unit tests as `simpler_lib_tests`, a benchmark as `bench_<name>`. Read from
  # cargo's artifact messages with sed (no JSON tool needed): `"target":{"kind":["test"],...,
  # "name":"opencl",...}` and `"executable":"/path"` (null for what is not an executable).
  local kind name exe n=0
  while read -r kind name exe; do
    case $kind in
      lib) name=${name}_lib_tests ;;
      bench) name=bench_$name ;;
    esac
    cp "$exe" "$stage/bin/${name//-/_}"
    n=$((n + 1))
  done < <(grep '"reason":"compiler-artifact"' "$json" | grep '"executable":"' |
    sed -n 's/.*"target":{"kind":\["\([a-z-]*\)"[^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2 \3/p')
  local want=$((${#SUITES[@]} + 4))
  if [ "$n" -ne "$want" ]; then
    echo "gpu_check: expected $want executables in cargo's messages, found $n" >&2
    return 1
  fi
  # Without debug symbols: a tenth of the size (kept where binutils is missing).
  if command -v strip >/dev/null; then strip "$stage"/bin/*; fi
  # The ICD loader, for a machine that has a driver but not the loader. (awk reads all of
  # ldconfig's output, so that ldconfig never writes to a closed pipe: pipefail would fail.)
  local loader
  loader=$(ldconfig -p | awk '/libOpenCL\.so\.1 .*x86-64/ && !v {v = $NF} END {print v}')
  if [ -n "$loader" ]; then cp -L "$loader" "$stage/bin/libOpenCL.so.1"; fi
  ls -l "$stage/bin"
  tar -czf "$DIR/gpu_check.tar.gz" -C "$stage" bin
  rm -rf "$stage"
  ls -l "$DIR/gpu_check.tar.gz"
}

# On the GPU machine: an ICD loader (the system's, else the one carried), and, when
# /etc/OpenCL/vendors names no driver and OCL_ICD_VENDORS is unset, a vendors folder naming
# every OpenCL driver library found (NVIDIA's, AMD's, Intel's).
find_opencl() {
  # (awk reads all of ldconfig's output: one that stopped early would fail the pipe.)
  local system
  system=$(ldconfig -p | awk '/libOpenCL\.so\.1/ && !v {v = $NF} END {print v}')
  if [ -n "$system" ]; then
    echo "ICD loader: $system"
  else
    export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "ICD loader: the one carried (Debian's ocl-icd)"
  fi
  if [ -n "${OCL_ICD_VENDORS:-}" ] || ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
    echo "OpenCL drivers: ${OCL_ICD_VENDORS:-$(cat /etc/OpenCL/vendors/*.icd | tr '\n' ' ')}"
    return
  fi
  # (Inside the unpacked folder, which goes when the script ends.)
  local vendors=$UNPACKED/vendors libs n=0
  mkdir -p "$vendors"
  libs=$({
    ldconfig -p | awk '/libnvidia-opencl\.so|libamdocl|libintelocl|libigdrcl/ {print $NF}'
    find /usr/local/nvidia /usr/lib /usr/lib64 /usr/local/cuda /opt -name 'libnvidia-opencl.so*' 2>/dev/null
  } | sort -u)
  for lib in $libs; do
    n=$((n + 1))
    echo "$lib" >"$vendors/driver$n.icd"
  done
  export OCL_ICD_VENDORS=$vendors
  echo "OpenCL drivers (none in /etc/OpenCL/vendors): ${libs:-none found}"
}

run() {
  local logs=${OUT:-$DIR/logs} failed=0
  mkdir -p "$logs"
  UNPACKED=$(mktemp -d)
  trap 'rm -rf "$UNPACKED"' EXIT
  tar -xzf "$DIR/gpu_check.tar.gz" -C "$UNPACKED" || return 1
  BIN=$UNPACKED/bin
  find_opencl
  nvidia-smi -L 2>/dev/null || true
  export SIMPLER_REQUIRE_OPENCL=1 RUST_BACKTRACE=1
  step() { # a name for the log, then the command
    local name=$1 start=$SECONDS
    shift
    if "$@" >"$logs/$name.log" 2>&1; then
      echo "ok     $name ($((SECONDS - start)) s)"
    else
      echo "FAILED $name ($((SECONDS - start)) s); the end of $name.log:"
      tail -n 25 "$logs/$name.log"
      failed=1
    fi
  }
  step list_devices "$BIN/opencl_vector_add" --list-devices
  cat "$logs/list_devices.log"
  for s in "${SUITES[@]}"; do
    step "$s" "$BIN/$s"
  done
  step simpler_rt_opencl "$BIN/simpler_lib_tests" chip::runtime::tests_opencl::
  step opencl_vector_add "$BIN/opencl_vector_add" --device opencl
  step tiled_matmul "$BIN/tiled_matmul" --device opencl
  step opencl_bench "$BIN/bench_opencl"
  grep '^figure' "$logs/opencl_bench.log" || true
  return $failed
}

case $what in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: $0 prepare|run [DIR]" >&2
    exit 2
    ;;
esac
