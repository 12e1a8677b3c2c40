#!/bin/sh
# A real public kernel library, side by side with `git bisect run`: Liger-Kernel's fused MoE kernels wrap
# their int32 row offsets once TK * stride passes 2**31 (upstream #1246), an illegal memory access in a
# training step at that size; fixed by 96ce8e85 (#1248). The kernels were added with the bug (1faa0131), so
# the question a user asks of this history is "which commit fixed it, to backport": `start --find-fix`
# over 1faa0131..e1eeb997, 67 commits of the real history, the fix 44 commits in. The repro is
# moe_repro.py, run from outside the repository with PYTHONPATH=src, as a training job that imports the
# library from its checkout would; LIGER_FUSED_MOE_AUTOTUNE=0 (the library's own switch) pins one config
# per kernel where the library has it, as a training job does to keep autotune's memory out.
#
# QUESTION=regression asks the other question of the same history: which commit brought the fault, over
# 1faa0131~1..96ce8e85~1 (44 commits; the kernels arrive with the bug, so the answer is 1faa0131), with
# moe_regress.py, which exits 0 where the kernels do not exist yet. That is `start` as users run it, with
# its stages (triage, the shrink, the bundle) after the search.
#
# Usage (on a machine with a CUDA GPU of 40 GB or more, torch and triton):
#   [QUESTION=regression] benches/liger_moe/run.sh CUDABISECT LIGER_REPO OUT_DIR [git|cudabisect|both]
# LIGER_REPO: a clone of https://github.com/linkedin/Liger-Kernel (it is cloned again into OUT_DIR).
# Each tool starts on an empty Triton cache of its own (TRITON_CACHE_DIR under OUT_DIR), so neither reuses
# the other's compiled kernels; CACHE=shared leaves the machine's cache to both (git bisect run goes first).
# AGAIN=1 runs `start` a second time on the same clone (below).
# RANGE=releases asks each question between the releases a user upgrades across: the regression over
# v0.7.0..v0.8.0 (79 commits; the kernels arrived in v0.8.0 with the bug), the fix over v0.8.0..v0.8.2 (93
# commits; the fix is in v0.8.1).
# REPRO=mixtral_train.py asks the regression with a user's training job instead of moe_regress.py: a small
# Mixtral from transformers with apply_liger_kernel_to_mixtral(), which trains through Liger's per-expert loop
# before the fused kernels and faults from the commit that routes the experts through them (#1179, which
# added the kernels). Every step of either tool then pays the whole job, as a user's bisection does.
set -eu
bin=$(realpath "$1"); src=$2; out=$(realpath -m "$3"); which=${4:-both}
here=$(dirname "$(realpath "$0")")
question=${QUESTION:-fix}
if [ "$question" = regression ]; then
  old=${OLD:-1faa0131~1}; new=${NEW:-96ce8e85~1}; repro=moe_regress.py
  if [ "${RANGE:-}" = releases ]; then old=${OLD:-v0.7.0}; new=${NEW:-v0.8.0}; fi
else
  old=${OLD:-1faa0131}; new=${NEW:-e1eeb997}; repro=moe_repro.py
  if [ "${RANGE:-}" = releases ]; then old=${OLD:-v0.8.0}; new=${NEW:-v0.8.2}; fi
fi  # OLD, NEW: the same commits in a rewritten copy of the history
repro=${REPRO:-$repro}
mkdir -p "$out"
cache() { if [ "${CACHE:-own}" != shared ]; then rm -rf "$out/triton-$1"; export TRITON_CACHE_DIR="$out/triton-$1"; fi; }
repo=$out/liger
rm -rf "$repo" && git clone -q "$src" "$repo"
old=$(git -C "$repo" rev-parse "$old"); new=$(git -C "$repo" rev-parse "$new")
git -C "$repo" checkout -q "$new"
printf '[repro]\ncommand = "python3 %s/%s"\ntimeout = "300s"\nenv = { PYTHONPATH = "src", LIGER_FUSED_MOE_AUTOTUNE = "0" }\n' "$here" "$repro" > "$out/bisect.toml"
if [ "$which" != cudabisect ]; then
  # For a fix, git's terms: the old state is "broken" (the step exits 0 when the repro faults), the new
  # "fixed". For the regression, plain good and bad: the step exits 1 when the repro faults.
  if [ "$question" = regression ]; then faults=1 clean=0; else faults=0 clean=1; fi
  cat > "$out/step.sh" <<STEP
#!/bin/sh
out=\$(CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=src LIGER_FUSED_MOE_AUTOTUNE=0 python3 "$here/$repro" 2>&1); rc=\$?
printf '%s\n' "\$out" | tail -3
if [ \$rc -eq 0 ]; then exit $clean; fi
if printf '%s' "\$out" | grep -q 'illegal memory access'; then exit $faults; fi
exit 125
STEP
  chmod +x "$out/step.sh"
  cache git
  s=$(date +%s)
  if [ "$question" = regression ]; then
    git -C "$repo" bisect start "$new" "$old" >/dev/null
  else
    git -C "$repo" bisect start --term-old=broken --term-new=fixed "$new" "$old" >/dev/null
  fi
  (cd "$repo" && git bisect run "$out/step.sh") > "$out/git-bisect.log" 2>&1 || true
  echo "git bisect run: $(( $(date +%s) - s )) s, $(grep -c '^running' "$out/git-bisect.log") steps, $(grep -E 'is the first (fixed|bad) commit' "$out/git-bisect.log")"
  git -C "$repo" bisect reset "$new" >/dev/null 2>&1
fi
if [ "$which" != git ]; then
  if [ "$question" = regression ]; then fix=; else fix=--find-fix; fi
  # AGAIN=1: `start` a second time on the same clone, as a nightly job or a second try does (the journal
  # not replayed, the Triton cache emptied again; what the first run's warm probes taught is kept).
  for again in "" $( [ "${AGAIN:-0}" = 1 ] && echo -again ); do
    cache cudabisect
    s=$(date +%s)
    "$bin" start "$old..$new" $fix --fresh --config "$out/bisect.toml" -C "$repo" --report "$out/report$again.json" \
      --message-format json 2> "$out/cudabisect$again.stderr" \
      | while IFS= read -r l; do printf '%s\t%s\n' "$(date +%s.%N)" "$l"; done > "$out/events$again.tsv"
    echo "cudabisect start $fix${again:+ (again)}: $(( $(date +%s) - s )) s (events with their arrival times in $out/events$again.tsv)"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['result'], (r.get('first_bad') or r.get('fix') or {}).get('commit'), (r.get('first_bad') or r.get('fix') or {}).get('subject'), len(r['probes']), 'probes')" "$out/report$again.json"
  done
fi
