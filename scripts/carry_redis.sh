#!/usr/bin/env bash
# Copies this machine's redis-server and the shared libraries it loads into DIR (default: .redis at
# the repository root, which .gitignore ignores), so that a machine without Redis (the lent GPU
# machine) can run it from that folder. Usage: scripts/carry_redis.sh [DIR]
#
#   DIR/redis-server   the binary (a real file, named redis-server: Redis picks its mode by name)
#   DIR/lib/           what `ldd` lists, except the C library's core
#   DIR/glibc/         the C library's core (libc, libm, libpthread, libdl, librt, the loader),
#                      used only where the other machine's C library is older than this one's:
#                      DIR/glibc/ld-linux-x86-64.so.2 --library-path DIR/lib:DIR/glibc DIR/redis-server
#   DIR/VERSION        `redis-server --version` and the C library it was built against
#
# benchmarks/service_h200.py tries `LD_LIBRARY_PATH=DIR/lib DIR/redis-server` first and falls back
# to the carried loader. Both ways are checked here before the script returns.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.redis}
src=${REDIS_SERVER:-$(command -v redis-server || echo /usr/bin/redis-server)}
[ -x "$src" ] || { echo "error: no redis-server here ($src); apt-get install redis-server" >&2; exit 2; }

rm -rf "$dir"
mkdir -p "$dir/lib" "$dir/glibc"
cp -L "$src" "$dir/redis-server"
chmod 755 "$dir/redis-server"

# ldd lines: "libfoo.so.1 => /path/libfoo.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
ldd "$src" | while read -r first arrow path _; do
  if [ "$arrow" = "=>" ]; then lib=$path; else lib=$first; fi
  case "$lib" in /*) ;; *) continue ;; esac            # linux-vdso and the like
  name=$(basename "$lib")
  case "$name" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*.so.*)
      cp -L "$lib" "$dir/glibc/$name" ;;
    *) cp -L "$lib" "$dir/lib/$name" ;;
  esac
done
loader=$(ls "$dir"/glibc/ld-linux*.so.* | head -1)
chmod 755 "$loader"
glibc=$(ldd --version | head -1 | awk '{print $NF}')
{ "$dir/redis-server" --version; echo "built against glibc $glibc ($(. /etc/os-release; echo "$PRETTY_NAME"))"; } > "$dir/VERSION"

# check: both ways start from the folder, and every library comes from the folder (the system's
# library folders are still searched last by the loader, so read where each one was found)
plain=$(env -i LD_LIBRARY_PATH="$dir/lib" "$dir/redis-server" --version)
viald=$(env -i "$loader" --library-path "$dir/lib:$dir/glibc" "$dir/redis-server" --version)
found=$(env -i LD_DEBUG=libs "$loader" --library-path "$dir/lib:$dir/glibc" "$dir/redis-server" \
          --version 2>&1 >/dev/null | sed -n 's/.*calling init: //p' | sort -u)
outside=$(echo "$found" | grep -v "^$dir/" || true)
if [ -n "$outside" ]; then
  echo "error: loaded from outside $dir: $outside" >&2; exit 1
fi
echo "$plain"
echo "$(echo "$found" | wc -l) libraries, all from $dir (carried loader: ok)"
du -sh "$dir"
