#!/usr/bin/env bash
# Run benchmark commands on the device tool's machine so that everything comes back: the tool
# returns at most 8 files from $OUT, so each command's output directory is packed into one
# archive when the command ends (also when its time limit kills it).
# Usage: benchmarks/pack_out.sh OUT SECONDS NAME COMMAND... ; COMMAND gets OUT/NAME as its OUTDIR
#   e.g. benchmarks/pack_out.sh $OUT 300 strat bash benchmarks/strategies_gpu.sh
# Result: OUT/NAME.tgz (unpack with tar xzf) and OUT/NAME.log.
set -u
OUT=$1; SECS=$2; NAME=$3; shift 3
mkdir -p "$OUT/$NAME"
timeout "$SECS" "$@" "$OUT/$NAME" > "$OUT/$NAME.log" 2>&1
rc=$?
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && rm -rf "${OUT:?}/$NAME"
echo "$NAME: exit $rc, $(date -u +%T)" | tee -a "$OUT/$NAME.log"
