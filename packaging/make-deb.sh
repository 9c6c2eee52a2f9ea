#!/bin/sh
# usage: make-deb.sh OUTDIR   (make deb)
# Builds the Debian packages cxlkv-dkms, libcxlkv0, libcxlkv-dev, cxlkv-tools
# and python3-cxlkv with dpkg-buildpackage from a copy of the source tree in
# OUTDIR/cxlkv-VERSION (the files git tracks, plus new ones it does not
# ignore), then runs lintian on them and fails on any lintian error.
# The .deb files end in OUTDIR.
set -eu
out=$(mkdir -p "$1" && cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n '1s/^cxlkv (\([^)]*\)).*/\1/p' "$src/debian/changelog")
upstream=${version%-*}
tree=$out/cxlkv-$upstream
for t in dpkg-buildpackage dh lintian; do
	command -v $t > /dev/null || { echo "make-deb: $t not found (make deps installs it)" >&2; exit 1; }
done

rm -rf "$tree"
mkdir -p "$tree"
if git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
	(cd "$src" && git ls-files -z --cached --others --exclude-standard) |
		(cd "$src" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
		(cd "$src" && cpio -0 -pdm --quiet "$tree")
else
	(cd "$src" && tar --exclude=./build --exclude=./.git -cf - .) | (cd "$tree" && tar -xf -)
fi
rm -f "$out"/*.deb "$out"/*.changes "$out"/*.buildinfo

# ccache (where installed) keeps rebuilds of the same tree fast; its cache
# lives beside the packages unless CCACHE_DIR names one.
export CCACHE_BASEDIR="$tree" CCACHE_DIR="${CCACHE_DIR:-$out/ccache}"
jobs=$(nproc 2> /dev/null || echo 2)
echo "make-deb: building cxlkv $version in $tree"
(cd "$tree" && DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}" \
	dpkg-buildpackage -b -us -uc > "$out/build.log" 2>&1) || {
	tail -n 60 "$out/build.log" >&2
	echo "make-deb: dpkg-buildpackage failed, log: $out/build.log" >&2
	exit 1
}
changes=$(ls "$out"/cxlkv_"$version"_*.changes)
ls -1 "$out"/*.deb
# Errors fail the build; warnings and notes are printed for the record.
if ! lintian --fail-on error "$changes" > "$out/lintian.log" 2>&1; then
	cat "$out/lintian.log" >&2
	echo "make-deb: lintian reports errors" >&2
	exit 1
fi
cat "$out/lintian.log"
echo "make-deb: lintian: $(grep -c '^E:' "$out/lintian.log" || true) errors, $(grep -c '^W:' "$out/lintian.log" || true) warnings"
# The copied tree and its build (hundreds of MB) are not needed once the
# packages are made; build.log stays.
rm -rf "$tree"
