#!/usr/bin/env bash
# expect-exit.sh CODE CMD [ARGS...]: run CMD (at most 60 s); succeed only if it
# exits with exactly CODE. Its stdout and stderr pass through, so a test can
# pipe them into FileCheck. A crash (signal) or a hang is always a failure.
set -u
expected=$1
shift
timeout 60 "$@"
status=$?
if [ "$status" -ne "$expected" ]; then
  case $status in
    124) what="hung (killed after 60 s)" ;;
    12[5-9]|1[3-9][0-9]) what="crashed or was killed (status $status)" ;;
    *) what="exited with status $status" ;;
  esac
  echo "expect-exit: '$*' $what, expected status $expected" >&2
  exit 1
fi
exit 0
