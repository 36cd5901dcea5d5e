#!/usr/bin/env bash
# Run on the development machine (which has apt and the network): downloads the Debian
# packages of cmocka (the C tests) and cJSON (the tool's JSON) into .deps/ at the repository
# root, for bench/gpu.sh to unpack on the lent GPU machine, where nothing can be installed.
# .deps/ is kept out of git through .git/info/exclude; the device call must name it in
# `carry` so that it travels with the working tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
pkgs=(libcmocka0 libcmocka-dev libcjson1 libcjson-dev)
mkdir -p "$deps"
exclude="$(git -C "$root" rev-parse --git-common-dir)/info/exclude"
case "$exclude" in /*) ;; *) exclude="$root/$exclude" ;; esac
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.deps/' "$exclude" 2>/dev/null || echo '/.deps/' >>"$exclude"
rm -f "$deps"/*.deb
# apt-get download writes into the current directory; as root it warns that the _apt user
# cannot reach it, which is harmless.
(cd "$deps" && apt-get download "${pkgs[@]}" 2>&1) | grep -v '^W: Download is performed unsandboxed' || true
n=$(find "$deps" -maxdepth 1 -name '*.deb' | wc -l)
if [ "$n" -ne ${#pkgs[@]} ]; then
  echo "fetch_deps: expected ${#pkgs[@]} .deb files in $deps, found $n" >&2
  exit 1
fi
ls -l "$deps"
echo "fetch_deps: done; name .deps in the device call's carry list"
