#!/usr/bin/env bash
# Verifies the build-tree copy of systemd/servedeck.service with systemd-analyze.
# Exit 77 (skipped) when systemd-analyze is not installed; any finding fails the test.
set -u
unit=$1
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not installed: skipped"; exit 77; }
[ -x "$(dirname "$unit")/../gateway/servedeck" ] || { echo "servedeck binary not built next to the unit"; exit 1; }
out=$(systemd-analyze verify "$unit" 2>&1)
rc=$?
# Lines about other units on this machine are not ours; keep only lines naming our unit.
ours=$(printf '%s\n' "$out" | grep -F "servedeck.service" || true)
printf '%s\n' "$out"
if [ $rc -ne 0 ] || [ -n "$ours" ]; then
  echo "FAIL: systemd-analyze verify reported problems with servedeck.service"
  exit 1
fi
grep -q '^Type=notify' "$unit" || { echo "FAIL: unit is not Type=notify"; exit 1; }
grep -q '^LimitMEMLOCK=infinity' "$unit" || { echo "FAIL: LimitMEMLOCK=infinity missing"; exit 1; }
echo "servedeck.service verified"
