#!/usr/bin/env bash
# Lint: the daemon reads and writes JSON only through common/json_limits.hpp (parse_untrusted,
# dump_safe). Fails, naming file:line, on a bare json::parse( / json::accept( or a .dump( /
# ->dump( call in the daemon's sources (gateway/, policies/, common/, registry/, preflight/),
# outside common/json_limits.cpp. Text after // is ignored (comments may name the calls).
# Usage: no_bare_json_test.sh [SOURCE_DIR]   (default: the repository this script lives in)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
dirs=(gateway policies common registry preflight)
for d in "${dirs[@]}"; do
  [[ -d $d ]] || { echo "no_bare_json: $root/$d is missing (wrong source dir?)" >&2; exit 2; }
done
found=0
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  code=${rest#*:}
  code=${code%%//*}
  [[ $file == common/json_limits.cpp ]] && continue
  if grep -qE '(json::parse|json::accept)[[:space:]]*\(|(\.|->)[[:space:]]*dump[[:space:]]*\(' <<<"$code"; then
    echo "$file:$line: bare JSON call (use servedeck::parse_untrusted / servedeck::dump_safe from common/json_limits.hpp): ${code#"${code%%[![:space:]]*}"}"
    found=1
  fi
done < <(grep -rnE --include='*.cpp' --include='*.hpp' --include='*.h' --include='*.cc' \
           '(json::parse|json::accept)[[:space:]]*\(|(\.|->)[[:space:]]*dump[[:space:]]*\(' "${dirs[@]}" || true)
if ((found)); then
  echo "no_bare_json: FAILED" >&2
  exit 1
fi
echo "no_bare_json: no bare json::parse/json::accept/.dump in ${dirs[*]}"
