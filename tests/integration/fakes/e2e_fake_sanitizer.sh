#!/bin/sh
tool=""; xml=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool="$2"; shift 2 ;;
    --save) xml="$2"; shift 2 ;;
    --print-limit|--error-exitcode|--show-backtrace) shift 2 ;;
    --xml) shift ;;
    *) break ;;
  esac
done
echo "$tool $*" >> "$FAKE_SANITIZER_CALLS"
case "$tool" in
  racecheck) cat "$FIXTURES/h200_race_racecheck.log"; cp "$FIXTURES/h200_race_racecheck.xml" "$xml"; exit 86 ;;
  *) echo "========= COMPUTE-SANITIZER"; "$@"; rc=$?; echo "========= ERROR SUMMARY: 0 errors"; exit $rc ;;
esac
