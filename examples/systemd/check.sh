#!/usr/bin/env bash
# Checks the systemd example: `systemd-analyze verify` on the unit and the sysusers snippet, and
# the capability lines against README's "Least privilege" table, so the two cannot drift.
# Needs systemd-analyze (Debian package `systemd`); no running systemd.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
readme="$here/../../README.md"
unit="$here/wasmswitch.service"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# verify refuses a unit whose ExecStart binary is missing, and this machine has no
# /usr/local/bin/wasmswitch: check a copy whose ExecStart and ExecReload point at an executable
# stub instead. Only that path changes; every other line is verified as shipped.
printf '#!/bin/sh\nexit 0\n' >"$tmp/wasmswitch" && chmod 0755 "$tmp/wasmswitch"
grep -q '^ExecStart=/usr/local/bin/wasmswitch ' "$unit" || { echo "ExecStart is not /usr/local/bin/wasmswitch ..." >&2; exit 1; }
grep -q '^ExecReload=/usr/local/bin/wasmswitch reload ' "$unit" || { echo "ExecReload is not /usr/local/bin/wasmswitch reload ..." >&2; exit 1; }
sed -e "s#^ExecStart=/usr/local/bin/wasmswitch #ExecStart=$tmp/wasmswitch #" \
    -e "s#^ExecReload=/usr/local/bin/wasmswitch #ExecReload=$tmp/wasmswitch #" "$unit" >"$tmp/wasmswitch.service"
# verify exits 0 on unknown keys and unparsable values (it only warns), so any output fails.
out=$(cd "$tmp" && systemd-analyze verify ./wasmswitch.service 2>&1) || { echo "$out" >&2; exit 1; }
if [ -n "$out" ]; then echo "systemd-analyze verify warned:" >&2; echo "$out" >&2; exit 1; fi
out=$(systemd-sysusers --dry-run --root="$tmp/root" "$here/wasmswitch.conf" 2>&1) || { echo "$out" >&2; exit 1; }
if echo "$out" | grep -qi 'fail\|invalid\|ignoring'; then echo "$out" >&2; exit 1; fi

# The documented set: the capability names in README's "Least privilege" table, upper-cased.
want=$(awk '/^## Least privilege/{on=1; next} /^## /{on=0} on' "$readme" |
  grep -o '^| `cap_[a-z_]*`' | grep -o 'cap_[a-z_]*' | tr a-z A-Z | sort | tr '\n' ' ')
[ -n "$want" ] || { echo "no capabilities found in README's Least privilege table" >&2; exit 1; }
for key in AmbientCapabilities CapabilityBoundingSet; do
  n=$(grep -c "^$key=" "$unit" || true)
  [ "$n" = 1 ] || { echo "$key= appears $n times in the unit (want exactly once)" >&2; exit 1; }
  got=$(grep "^$key=" "$unit" | cut -d= -f2- | tr ' ' '\n' | grep . | sort | tr '\n' ' ')
  if [ "$got" != "$want" ]; then
    echo "$key is '$got', README documents '$want'" >&2
    exit 1
  fi
done
grep -q '^User=wasmswitch$' "$unit" && grep -q '^u wasmswitch ' "$here/wasmswitch.conf" ||
  { echo "the unit's User= and the sysusers snippet disagree" >&2; exit 1; }
echo "systemd: unit verifies; capabilities match README ($want)"
