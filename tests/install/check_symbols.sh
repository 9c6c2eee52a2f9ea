#!/bin/sh
# usage: check_symbols.sh LIBCXLKV.so HEADER_DIR
# The dynamic symbol table of libcxlkv.so is its C API and nothing else:
#  - every defined dynamic symbol is cxlkv_* in version node CXLKV_0 (plus the
#    node's own CXLKV_0 symbol), so nothing of the C++ runtime leaks;
#  - every cxlkv_* function declared in the public headers is exported, and
#    every exported cxlkv_* is declared in a public header;
#  - the SONAME is libcxlkv.so.<major>.
set -eu
lib=$1 hdr=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
case $soname in
libcxlkv.so.[0-9]*) echo "SONAME $soname" ;;
*) echo "FAIL: SONAME of $lib is '$soname', not libcxlkv.so.N"; fail=1 ;;
esac

# "ADDR T name@@NODE" (binutils >= 2.35 prints the version with -D).
nm -D --defined-only --with-symbol-versions "$lib" | awk '{ print $NF }' | sort > "$tmp/all"
n=$(wc -l < "$tmp/all")
grep -v -E '^(cxlkv_[A-Za-z0-9_]+@@CXLKV_0|CXLKV_0(@@CXLKV_0)?)$' "$tmp/all" > "$tmp/bad" || true
if [ -s "$tmp/bad" ]; then
	echo "FAIL: $(wc -l < "$tmp/bad") of $n exported symbols are not cxlkv_*@@CXLKV_0:"
	head -20 "$tmp/bad" | sed 's/^/  /'
	fail=1
fi
grep -q -E '^CXLKV_0(@@CXLKV_0)?$' "$tmp/all" || { echo "FAIL: no version node CXLKV_0"; fail=1; }
sed -n 's/^\(cxlkv_[A-Za-z0-9_]*\)@@CXLKV_0$/\1/p' "$tmp/all" | sort -u > "$tmp/exported"

# Functions declared in the public headers: "cxlkv_name(" at a declaration
# (not a call inside a macro or comment line).
cat "$hdr"/*.h | sed -e 's,/\*.*\*/,,g' -e 's,//.*,,' |
	grep -v -E '^[[:space:]]*(\*|/\*|#)' |
	grep -o -E '\bcxlkv_[a-z0-9_]+[[:space:]]*\(' | sed 's/[[:space:]]*($//' | sort -u > "$tmp/declared"
comm -23 "$tmp/declared" "$tmp/exported" > "$tmp/missing"
comm -13 "$tmp/declared" "$tmp/exported" > "$tmp/undeclared"
if [ -s "$tmp/missing" ]; then
	echo "FAIL: declared in $hdr but not exported:"; sed 's/^/  /' "$tmp/missing"; fail=1
fi
if [ -s "$tmp/undeclared" ]; then
	echo "FAIL: exported but declared in no public header:"; sed 's/^/  /' "$tmp/undeclared"; fail=1
fi
echo "$(wc -l < "$tmp/exported") cxlkv_* symbols exported in CXLKV_0, $(wc -l < "$tmp/declared") declared, $n dynamic symbols in all"
exit $fail
