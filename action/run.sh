#!/usr/bin/env bash
# The cudabisect GitHub Action's work (action.yml runs it), as one script so it runs and is tested the same
# way outside Actions. Reads the action's inputs as INPUT_* variables; writes the report, JUnit and the
# packed bundle under INPUT_OUTPUT_DIR, the step summary (cudabisect appends it to $GITHUB_STEP_SUMMARY)
# and the step's outputs to $GITHUB_OUTPUT. Exits with cudabisect's code: for `nightly` a good night is 0
# (`--exit-codes ci`), a regression 12, still failing 13; for `start` 0 is "found".
set -uo pipefail

command=${INPUT_COMMAND:-nightly}
out=${INPUT_OUTPUT_DIR:-cudabisect-out}
bin=${CUDABISECT:-cudabisect}
mkdir -p "$out" || exit 2

args=()
case "$command" in
  nightly)
    args=(nightly --state "${INPUT_STATE:-.cudabisect-state}" --exit-codes ci)
    [ -n "${INPUT_BRANCH:-}" ] && args+=(--branch "$INPUT_BRANCH")
    [ -n "${INPUT_SINCE:-}" ] && args+=(--since "$INPUT_SINCE")
    ;;
  start)
    if [ -z "${INPUT_RANGE:-}" ]; then
      echo "cudabisect action: command start needs range (GOOD..BAD, e.g. the pull request's base sha..head sha)" >&2
      exit 2
    fi
    args=(start "$INPUT_RANGE")
    ;;
  *)
    echo "cudabisect action: command must be nightly or start, not \`$command\`" >&2
    exit 2
    ;;
esac
args+=(--report "$out/report.json" --junit "$out/junit.xml")
[ -n "${INPUT_CONFIG:-}" ] && args+=(--config "$INPUT_CONFIG")
if [ -n "${INPUT_ARGS:-}" ]; then
  # Extra options, split as a shell would split them (quotes kept), never evaluated.
  eval "extra=($(printf '%s' "$INPUT_ARGS" | python3 -c 'import shlex,sys; print(" ".join(shlex.quote(w) for w in shlex.split(sys.stdin.read())))'))"
  args+=("${extra[@]}")
fi

echo "+ $bin ${args[*]}" >&2
"$bin" "${args[@]}"
code=$?

# The bundle, packed for upload: `start`'s report names it at .bundle, a night's at .bisect.bundle.
mapfile -t found < <(python3 - "$out/report.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("-\n-"); sys.exit()
run = (r.get("bisect") if "nightly" in r else r) or {}
first = (run.get("first_bad") or {}).get("commit") or (r.get("nightly") or {}).get("first_bad") or "-"
print(first)
print(run.get("bundle") or "-")
PY
)
first_bad=${found[0]:--}
bundle=${found[1]:--}
archive=""
if [ "$bundle" != "-" ] && [ -d "$bundle" ]; then
  archive="$out/cudabisect-bundle.tar.gz"
  "$bin" bundle pack "$bundle" -o "$archive" >&2 || archive=""
fi
[ "$first_bad" = "-" ] && first_bad=""

if [ -n "${GITHUB_OUTPUT:-}" ]; then
  {
    echo "exit-code=$code"
    echo "first-bad=$first_bad"
    echo "report=$out/report.json"
    echo "junit=$out/junit.xml"
    echo "bundle=$archive"
  } >> "$GITHUB_OUTPUT"
fi
exit "$code"
