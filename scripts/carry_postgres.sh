#!/usr/bin/env bash
# Packs this machine's PostgreSQL server (initdb, postgres, pg_ctl), the server modules initdb
# needs, its share files, redis-server (bin/, where there is one) and the shared libraries they
# load into DIR/pgsql.tar.xz (default DIR:
# .pgsql at the repository root, which .gitignore ignores), so that a machine without PostgreSQL
# (the lent GPU machine) can run a throwaway server from it. Usage: scripts/carry_postgres.sh [DIR]
#
# Inside the archive the Debian layout is kept (usr/lib/postgresql/V/bin, .../lib,
# usr/share/postgresql/V): the server finds its share and module folders relative to its own
# binary when the layout matches its build's, wherever the archive is unpacked. lib/ holds what
# `ldd` lists, except the C library's core (the other machine's newer one is used). Compressed,
# because ICU's data alone is 30 MB.
#
# benchmarks/_service_pg.py unpacks it into a temporary folder, runs initdb and the server as an
# unprivileged user (the server refuses root), with the time zone GMT (built into the server: the
# other machine may have no /usr/share/zoneinfo) and trust authentication on 127.0.0.1 only.
# Checked here before the script returns: unpacked elsewhere, with /usr/lib/postgresql,
# /usr/share/postgresql and /usr/share/zoneinfo hidden (a private mount namespace, where this
# machine allows one), a fresh initdb, a server on a free port, a query, a clean stop.
set -euo pipefail
shopt -s nullglob
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.pgsql}
pgbin=${PG_BINDIR:-$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | tail -1)}
[ -x "$pgbin/postgres" ] || { echo "error: no PostgreSQL server in $pgbin" >&2; exit 2; }
ver=$(basename "$(dirname "$pgbin")")
pglib=$(dirname "$pgbin")/lib
share=/usr/share/postgresql/$ver
[ -f "$share/postgres.bki" ] || { echo "error: no share folder $share" >&2; exit 2; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/usr/lib/postgresql/$ver/bin
m=$stage/usr/lib/postgresql/$ver/lib
s=$stage/usr/share/postgresql/$ver
mkdir -p "$b" "$m" "$s/extension" "$stage/lib"
for exe in postgres initdb pg_ctl; do cp -L "$pgbin/$exe" "$b/$exe"; done
# redis-server too, where there is one: it loads mostly the same libraries, so beside the server
# it costs ~1 MB of the archive instead of a 17 MB .redis folder (scripts/carry_redis.sh)
redis=${REDIS_SERVER:-$(command -v redis-server || true)}
if [ -n "$redis" ]; then mkdir -p "$stage/bin"; cp -L "$redis" "$stage/bin/redis-server"; fi
# the UTC zone file: Celery's kombu reads ZoneInfo("UTC") at import, and the other machine may
# have no time zone database (the benchmark points PYTHONTZPATH here)
mkdir -p "$stage/zoneinfo"
cp -L /usr/share/zoneinfo/UTC "$stage/zoneinfo/UTC"
# server modules: all but the JIT (LLVM) and its bitcode
for so in "$pglib"/*.so; do
  case "$(basename "$so")" in llvmjit*) continue ;; esac
  cp -L "$so" "$m/"
done
# share: what initdb and the server read; of the extensions only plpgsql (initdb installs it)
for f in "$share"/*; do
  case "$(basename "$f")" in man|contrib|extension) continue ;; esac
  cp -rL "$f" "$s/"
done
cp -L "$share"/extension/plpgsql* "$s/extension/"

# ldd lines: "libfoo.so.1 => /path/libfoo.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
for obj in "$b"/* "$m"/*.so "$stage"/bin/*; do
  ldd "$obj" | while read -r first arrow path _; do
    if [ "$arrow" = "=>" ]; then lib=$path; else lib=$first; fi
    case "$lib" in /*) ;; *) continue ;; esac
    name=$(basename "$lib")
    case "$name" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*.so.*|libresolv.so.*) ;;
      *) [ -f "$stage/lib/$name" ] || cp -L "$lib" "$stage/lib/$name" ;;
    esac
  done
done
glibc=$(ldd --version 2>&1 | awk 'NR == 1 {print $NF}')
{ "$pgbin/postgres" --version; [ -z "$redis" ] || "$redis" --version
  echo "layout usr/lib/postgresql/$ver"
  echo "built against glibc $glibc ($(. /etc/os-release; echo "$PRETTY_NAME"))"; } > "$stage/VERSION"

rm -rf "$dir"
mkdir -p "$dir"
chmod -R u+rwX,go+rX "$stage"
tar -C "$stage" -cJf "$dir/pgsql.tar.xz" .
cp "$stage/VERSION" "$dir/VERSION"
echo "packed: $(du -sh "$stage" | cut -f1) unpacked, $(du -sh "$dir/pgsql.tar.xz" | cut -f1) in $dir/pgsql.tar.xz"

# check: the Python helper the benchmark uses, from a clean copy, with this machine's own
# PostgreSQL hidden where a private mount namespace is allowed
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
check=(env -i PATH=/usr/bin:/bin HOME=/tmp "$py" "$root/benchmarks/_service_pg.py" --check "$dir")
if unshare -m true 2>/dev/null; then
  unshare -m bash -c '
    for d in /usr/lib/postgresql /usr/share/postgresql /usr/share/zoneinfo; do
      [ -d "$d" ] && mount -t tmpfs none "$d"
    done
    exec "$@"' _ "${check[@]}"
else
  echo "(no private mount namespace here: checked with this machine's PostgreSQL visible)"
  "${check[@]}"
fi
du -sh "$dir"
