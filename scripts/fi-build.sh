#!/usr/bin/env bash
# Builds the libfabric provider (crate fi/, release) and gives it the name
# libfabric looks for in FI_PROVIDER_PATH: lib<name>-fi.so. Cargo cannot
# name a library with a hyphen (it makes libshmfab_fi.so), so this script
# links target/release/fi/libshmfab-fi.so to it and prints that directory:
#   FI_PROVIDER_PATH=$(scripts/fi-build.sh) fi_info -p shmfab
# With --link SO it only makes the link, in the directory `fi` beside SO
# (the provider's tests use it with the library cargo built for them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --link ]; then
  so=$(realpath "$2")
else
  cargo build --release -p shmfab-fi >&2
  so=$(realpath "${CARGO_TARGET_DIR:-target}/release/libshmfab_fi.so")
fi
[ -f "$so" ] || { echo "fi-build.sh: no $so" >&2; exit 1; }
dir=$(dirname "$so")/fi
mkdir -p "$dir"
# Atomic replace: tests running at once may link the same name.
ln -sfn "$so" "$dir/.libshmfab-fi.so.$$"
mv -fT "$dir/.libshmfab-fi.so.$$" "$dir/libshmfab-fi.so"
echo "$dir"
