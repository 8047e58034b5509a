#!/usr/bin/env bash
# Verifies the build-tree copy of systemd/servedeck.service with systemd-analyze, and the rules
# the unit keeps (docs/operations.md): Type=notify, a dedicated user with the GPU groups and the
# memlock limit and no other privilege, and one state directory shared with the CLI (no
# --state-dir override; the installed example config's state_dir is the unit's StateDirectory).
# Exit 77 (skipped) when systemd-analyze is not installed; any finding fails the test.
set -u
unit=$1
example=${2:-}
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
fail() { echo "FAIL: $*"; exit 1; }
value() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
[ "$(value User)" = servedeck ] || fail "User= is '$(value User)', expected the dedicated user servedeck"
[ "$(value Group)" = servedeck ] || fail "Group= is '$(value Group)', expected servedeck"
for g in video render; do
  value SupplementaryGroups | tr ' ' '\n' | grep -qx "$g" || fail "SupplementaryGroups lacks $g (GPU device nodes)"
done
[ -z "$(value AmbientCapabilities)" ] && grep -q '^CapabilityBoundingSet=$' "$unit" || fail "the unit grants capabilities"
grep -q '^NoNewPrivileges=yes' "$unit" || fail "NoNewPrivileges=yes missing"
case "$(value ExecStart)" in *--state-dir*) fail "ExecStart overrides the state directory; the CLI would not find it";; esac
[ "$(value StateDirectoryMode)" = 0710 ] || fail "StateDirectoryMode is '$(value StateDirectoryMode)', expected 0710"
state_dir=/var/lib/$(value StateDirectory)
if [ -n "$example" ]; then
  got=$(sed -n 's/^state_dir = "\([^"]*\)".*/\1/p' "$example")
  [ "$got" = "$state_dir" ] || fail "$example has state_dir = \"$got\"; the unit's StateDirectory is $state_dir"
fi
echo "servedeck.service verified"
