#!/bin/sh
# usage: uninstall.sh BUILD PREFIX [DESTDIR]   (make uninstall)
# Removes what `make install PREFIX=.. DESTDIR=..` installs from this build:
# the list of files comes from a fresh install of the same build with the same
# PREFIX into a scratch directory, so it does not depend on which install ran
# last.  Directories are removed only when empty and cxlkv's own (a path
# component named cxlkv*); files that are not cxlkv's are kept.
set -eu
build=$1 prefix=$2 destdir=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
DESTDIR="$tmp" cmake --install "$build" --prefix "$prefix" > /dev/null
n=0
for f in $(cd "$tmp" && find . ! -type d | sed 's,^\.,,'); do
	if [ -e "$destdir$f" ] || [ -L "$destdir$f" ]; then
		rm -f "$destdir$f"
		n=$((n + 1))
	fi
done
for d in $(cd "$tmp" && find . -mindepth 1 -type d | sed 's,^\.,,' | sort -r); do
	case /$d/ in
	*/cxlkv*) [ -d "$destdir$d" ] && rmdir "$destdir$d" 2> /dev/null || true ;;
	esac
done
echo "cxlkv: removed $n files from $destdir$prefix"
