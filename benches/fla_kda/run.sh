#!/bin/sh
# A real public kernel library's regression on Hopper: flash-linear-attention's KDA backward faults with an
# illegal memory access while Triton autotunes chunk_kda_bwd_kernel_wy_dqkg_fused (fixed upstream by
# dropping the faulting configs on Hopper, 3c6f70d1). The range is 042d998a~1 (good) .. 3c6f70d1~1 (bad),
# 81 commits; the repro is kda_repro.py (a forward and backward of chunk_kda), run from outside the
# repository with PYTHONPATH=. as a training job that imports the library from its checkout would.
#
# Usage (on a machine with a Hopper GPU, torch, triton and einops):
#   benches/fla_kda/run.sh CUDABISECT FLA_REPO OUT_DIR [git|cudabisect|both]
# FLA_REPO: a clone of https://github.com/fla-org/flash-linear-attention (it is cloned again into OUT_DIR).
set -eu
bin=$(realpath "$1"); src=$2; out=$(realpath -m "$3"); which=${4:-both}
here=$(dirname "$(realpath "$0")")
mkdir -p "$out"
repo=$out/fla
rm -rf "$repo" && git clone -q "$src" "$repo"
git -C "$repo" branch -f bad 3c6f70d1~1 && git -C "$repo" checkout -q bad
good=$(git -C "$repo" rev-parse 042d998a~1)
printf '[repro]\ncommand = "python3 %s/kda_repro.py"\ntimeout = "600s"\nenv = { PYTHONPATH = "." }\n' "$here" > "$out/bisect.toml"
if [ "$which" != cudabisect ]; then
  s=$(date +%s)
  git -C "$repo" bisect start bad "$good" >/dev/null
  (cd "$repo" && CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. git bisect run python3 "$here/kda_repro.py") > "$out/git-bisect.log" 2>&1 || true
  echo "git bisect run: $(( $(date +%s) - s )) s, $(grep -c '^running' "$out/git-bisect.log") steps, $(grep 'is the first bad commit' "$out/git-bisect.log")"
  git -C "$repo" bisect reset bad >/dev/null 2>&1
fi
if [ "$which" != git ]; then
  s=$(date +%s)
  "$bin" start "$good..bad" --fresh --config "$out/bisect.toml" -C "$repo" --report "$out/report.json" \
    --message-format json 2> "$out/cudabisect.stderr" \
    | while IFS= read -r l; do printf '%s\t%s\n' "$(date +%s.%N)" "$l"; done > "$out/events.tsv"
  echo "cudabisect start: $(( $(date +%s) - s )) s (events with their arrival times in $out/events.tsv)"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['result'], (r.get('first_bad') or {}).get('commit'), (r.get('first_bad') or {}).get('subject'), len(r['probes']), 'probes')" "$out/report.json"
fi
