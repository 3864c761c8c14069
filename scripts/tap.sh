# shellcheck shell=bash
# The checks' one way of saying what passed: sourced by scripts/check-packages,
# check-systemd, check-fleet and check-puppet-module. `ok`/`bad` count and print one line
# each, `check` runs a command as one check, `section` heads a group with the seconds so far,
# `summary` ends the run and sets its exit status.

passed=0
failed=0
started=$SECONDS
tap_name="scripts/${0##*/}"

ok() {
  passed=$((passed + 1))
  printf 'ok   - %s\n' "$*"
}

bad() {
  failed=$((failed + 1))
  printf 'FAIL - %s\n' "$*"
}

check() { # check DESCRIPTION COMMAND...: ok when COMMAND succeeds
  local what=$1
  shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}

section() { printf '\n== [%ss] %s\n' "$((SECONDS - started))" "$*"; }

die() {
  printf '%s: %s\n' "$tap_name" "$*" >&2
  exit 1
}

summary() { # summary NOTE: the totals (NOTE may be empty); the exit status is 0 only when nothing failed
  section "done in $((SECONDS - started))s${1:+ ($1)}"
  echo "${tap_name#scripts/}: $passed passed, $failed failed"
  ((failed == 0))
}
