#!/usr/bin/env bash
# Corpus sample: shell with pipes, here-docs, arrays and parameter expansion.
set -euo pipefail
shopt -s nullglob

declare -A sizes=()
files=("$@")
for f in "${files[@]:-/etc/hostname}"; do
	[[ -f $f ]] || { echo "skip: $f" >&2; continue; }
	sizes[$f]=$(wc -c <"$f")
done

for k in "${!sizes[@]}"; do
	printf '%-40s %10d\n' "${k##*/}" "${sizes[$k]}"
done | sort -k2 -n -r | head -n 5

cat <<-EOT
	user=${USER:-nobody} home=${HOME%/} pid=$$ status=$?
	EOT
awk -F: '$3 >= 1000 { print $1 }' /etc/passwd 2>/dev/null | tr '\n' ' ' || true
echo $(( (16#ff + 2#1010) * 3 ))
