#!/usr/bin/env bash
# Fills .kt_kernels/ (git-ignored: fetched code is never committed) with the real Kernel Tuner
# kernel that benchmarks/kt_import_h200.py imports, and its T1 file: convolution_milo.cu and
# convolution_milo.json from the Auto-Tuning Association's benchmark hub (MIT License). That T1
# file is byte-identical to /work/shared/replay/convolution_milo.T1.json (KernelFile
# convolution_milo.cu, KernelName convolution_kernel, 4096x4096 image, 15x15 filter); it is
# fetched too so that a device run, which sees only the checkout, has it.
#
#   bash scripts/fetch_kt_kernel.sh                                        # from GitHub
#   KT_HUB_GIT=/path/to/benchmark_hub/.git bash scripts/fetch_kt_kernel.sh # from a local clone
#
# Files are pinned by commit and checked by SHA-256, so a moved branch cannot change them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
repo=AutoTuningAssociation/benchmark_hub
commit=8eeb99e7179e6838af95d392ac6c60cebfd8c434
dest=$root/.kt_kernels
mkdir -p "$dest"

fetch() {  # fetch PATH_IN_REPO SHA256 DEST_NAME
  local tmp got
  tmp=$(mktemp "$dest/.fetch.XXXXXX")
  if [ -n "${KT_HUB_GIT:-}" ]; then
    ok=0; git --git-dir="$KT_HUB_GIT" show "$commit:$1" > "$tmp" || ok=$?
  else
    ok=0; curl -fsSL --max-time 60 "https://raw.githubusercontent.com/$repo/$commit/$1" \
      -o "$tmp" || ok=$?
  fi
  if [ "$ok" != 0 ]; then
    rm -f "$tmp"
    echo "error: cannot fetch $1 of $repo at $commit (set KT_HUB_GIT to a local clone)" >&2
    exit 1
  fi
  got=$(sha256sum "$tmp" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    rm -f "$tmp"
    echo "error: $1 at $commit has SHA-256 $got, expected $2" >&2
    exit 1
  fi
  chmod 644 "$tmp"
  mv "$tmp" "$dest/$3"
  echo "$3  https://github.com/$repo/blob/$commit/$1  sha256 $2" >> "$notes"
}

notes=$(mktemp "$dest/.source.XXXXXX")
trap 'rm -f "$notes"' EXIT
fetch kernels/convolution_milo.cu \
  14b74948ac333fc1ec00c4476bff1a2ea5063c622afab5f85a45685b13582948 convolution_milo.cu
fetch kernels/convolution_milo.json \
  7d64a0b6456ed3b3b075670b57e159624957bd3fcf6fee9e827ee2534d211b70 convolution_milo.T1.json
echo "MIT License, (c) 2025 AutoTuningAssociation; not part of this project" >> "$notes"
chmod 644 "$notes"; mv "$notes" "$dest/SOURCE.txt"
ls "$dest"
