#!/usr/bin/env bash
# The `consumer` test: installs the kiln of this build into a fresh prefix,
# configures and builds tests/consumer against it with find_package(kiln),
# and runs it. Usage: run.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S "$here" -B "$work/build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
# The installed tree holds the public headers only.
if find "$work/prefix/include" -name '*.h' | grep -v '/include/kiln/' | grep -q .; then
  echo "internal headers were installed"; exit 1
fi
"$work/build/consumer" "$work/cache"
