#!/bin/sh
# tests/install: cxlkv installed like a system package (docs/operations.md "Install").
# usage: run.sh CHECK SRC_DIR BUILD_DIR
#   destdir        cmake --install into $BUILD/tests/install/root (prefix /usr):
#                  the files a user gets (the fixture of the checks below)
#   pkgconfig      the C example of docs/api.md built with `pkg-config --cflags --libs
#                  cxlkv` against that tree (sysroot), linked, run
#   find_package   the same example as a CMake project: find_package(cxlkv)
#   cxx_static     a C++20 program using the C++ API, linked with
#                  find_package(cxlkv) -> cxlkv::cxlkv_static and with
#                  `pkg-config --static`
#   headers        every installed header compiles on its own (C: *.h, C++20: *.hpp)
#   symbols        libcxlkv.so exports cxlkv_* in CXLKV_0 only (check_symbols.sh)
#   version        every installed tool's --version names CXLKV_VERSION;
#                  dkms.conf, pyproject.toml, debian/changelog agree with version.h
#   man            the installed man pages render: man -l, groff -ww -z silent
#   completion     the bash completion loads and completes commands and options
#   python         the installed Python package imports with Debian's python3
#                  and loads the installed libcxlkv.so.0
#   make           make install / make uninstall with PREFIX and DESTDIR
#   debs           make deb (dpkg-buildpackage; lintian without errors), the five
#                  packages unpacked into a scratch root (dpkg -x), the docs/api.md
#                  C example built there with pkg-config and run, tools run
set -eu
check=$1 src=$(cd "$2" && pwd) build=$(cd "$3" && pwd)
root=$build/tests/install/root
work=$build/tests/install/work-$check
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
export LC_ALL=C.UTF-8

# The installed tree's library directory (lib or lib/<multiarch>).
libdir_of() { dirname "$(find "$1" -name 'libcxlkv.so.*.*' -type f | head -n 1)"; }
example_src() { sh "$src/tests/install/readme_example.sh" "$src/docs/api.md" "$work/readme_example.c"; }
# The binary needs libcxlkv.so.0 and no path into the build tree.
check_linkage() {
	readelf -d "$1" | grep -q 'NEEDED.*\[libcxlkv\.so\.0\]' || fail "$1 does not need libcxlkv.so.0"
	if readelf -d "$1" | grep -E 'RPATH|RUNPATH' | grep -q "$build/libruntime"; then fail "$1 has an rpath into the build tree"; fi
	if ldd "$1" 2>/dev/null | grep -q "$build/libruntime"; then fail "$1 loads libcxlkv from the build tree"; fi
}

case $check in
destdir)
	rm -rf "$root"
	DESTDIR="$root" cmake --install "$build" --prefix /usr > "$work/install.log"
	ld=$(libdir_of "$root")
	rel=${ld#"$root"}
	echo "library directory: $rel"
	for f in "$rel/libcxlkv.so.0" "$rel/libcxlkv.so" "$rel/pkgconfig/cxlkv.pc" \
		"$rel/cmake/cxlkv/cxlkvConfig.cmake" "$rel/cmake/cxlkv/cxlkvConfigVersion.cmake" \
		/usr/include/cxlkv/cxlkv.h /usr/include/cxlkv/version.h /usr/include/cxlkv/kv.hpp /usr/include/cxlkv/format/index_format.h /usr/include/uapi/cxlkv_pool.h \
		/usr/bin/cxlkvctl /usr/bin/cxlkvd /usr/bin/cxlkv-replay \
		/lib/systemd/system/cxlkvd.service /usr/lib/systemd/system/cxlkvd.service /etc/cxlkv/cxlkvd.conf \
		/usr/share/bash-completion/completions/cxlkvctl \
		/usr/share/man/man8/cxlkvctl.8 /usr/share/man/man8/cxlkvd.8 /usr/share/man/man1/cxlkv-replay.1 \
		/usr/share/man/man7/cxlkv.7 \
		/usr/lib/python3/dist-packages/cxlkv/__init__.py \
		"/usr/src/cxlkv-$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$src/dkms.conf")/dkms.conf"; do
		case $f in
		/lib/systemd/*) continue ;;  # prefix /usr: the unit is under /usr/lib
		esac
		[ -e "$root$f" ] || [ -L "$root$f" ] || fail "not installed: $f"
	done
	[ "$(readlink "$root$rel/libcxlkv.so")" = libcxlkv.so.0 ] || [ "$(readlink "$root$rel/libcxlkv.so")" = "$(basename "$(readlink -f "$root$rel/libcxlkv.so.0")")" ] ||
		fail "libcxlkv.so -> $(readlink "$root$rel/libcxlkv.so")"
	ls "$root/usr/src"/cxlkv-*/kmod/main.c "$root/usr/src"/cxlkv-*/uapi/cxlkv_pool.h > /dev/null
	# Configured for this prefix, not the build's.
	grep -q '^prefix=/usr$' "$root$rel/pkgconfig/cxlkv.pc" || fail "cxlkv.pc: prefix is not /usr"
	grep -q '^ExecStart=/usr/bin/cxlkvd ' "$root/usr/lib/systemd/system/cxlkvd.service" || fail "cxlkvd.service: ExecStart is not /usr/bin/cxlkvd"
	grep -q '^EnvironmentFile=-/etc/cxlkv/cxlkvd.conf$' "$root/usr/lib/systemd/system/cxlkvd.service" || fail "cxlkvd.service: EnvironmentFile"
	if grep -rl "$build" "$root$rel/pkgconfig" "$root$rel/cmake" "$root/usr/lib/systemd" "$root/etc"; then fail "installed files name the build tree"; fi
	if find "$root" -name '__pycache__' -o -name '*.pyc' | grep -q .; then fail "byte-compiled Python files installed"; fi
	echo "installed $(find "$root" -type f | wc -l) files under $root"
	;;
pkgconfig)
	example_src
	ld=$(libdir_of "$root")
	export PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$ld/pkgconfig" PKG_CONFIG_PATH=
	cflags=$(pkg-config --cflags cxlkv) libs=$(pkg-config --libs cxlkv)
	echo "pkg-config --cflags --libs cxlkv: $cflags $libs (version $(pkg-config --modversion cxlkv))"
	case "$cflags $libs" in *"$root"*) ;; *) fail "pkg-config flags do not point into the DESTDIR tree" ;; esac
	# shellcheck disable=SC2086
	cc -std=c11 -Wall -Wextra -Werror -o "$work/readme_example" "$work/readme_example.c" $cflags $libs
	check_linkage "$work/readme_example"
	LD_LIBRARY_PATH="$ld" "$work/readme_example"
	LD_LIBRARY_PATH="$ld" ldd "$work/readme_example" | grep 'libcxlkv\.so\.0 => '"$ld/" > /dev/null || fail "example did not load the installed libcxlkv"
	;;
find_package)
	example_src
	ld=$(libdir_of "$root")
	cmake -S "$src/tests/install/find_package" -B "$work/b" -DCMAKE_PREFIX_PATH="$root/usr" \
		-DEXAMPLE_SRC="$work/readme_example.c" -DCMAKE_C_COMPILER_LAUNCHER= > "$work/configure.log" ||
		{ cat "$work/configure.log"; fail "find_package(cxlkv) project did not configure"; }
	grep -q "cxlkv_DIR:PATH=$root/" "$work/b/CMakeCache.txt" || fail "find_package did not use the DESTDIR tree"
	cmake --build "$work/b" > "$work/build.log" || { cat "$work/build.log"; fail "build"; }
	check_linkage "$work/b/readme_example"
	LD_LIBRARY_PATH="$ld" "$work/b/readme_example"
	# A version the package does not provide is refused.
	printf 'cmake_minimum_required(VERSION 3.16)\nproject(p C)\nfind_package(cxlkv 99 REQUIRED)\n' > "$work/CMakeLists.txt"
	if cmake -S "$work" -B "$work/b99" -DCMAKE_PREFIX_PATH="$root/usr" > "$work/v99.log" 2>&1; then
		fail "find_package(cxlkv 99) succeeded"
	fi
	;;
cxx_static)
	cmake -S "$src/tests/install/cxx_static" -B "$work/b" -DCMAKE_PREFIX_PATH="$root/usr" \
		-DCMAKE_CXX_COMPILER_LAUNCHER= > "$work/configure.log" ||
		{ cat "$work/configure.log"; fail "the C++ consumer did not configure"; }
	cmake --build "$work/b" > "$work/build.log" || { cat "$work/build.log"; fail "build"; }
	if readelf -d "$work/b/cxx_static" | grep -q 'NEEDED.*libcxlkv'; then fail "cxx_static needs libcxlkv.so"; fi
	"$work/b/cxx_static"
	ld=$(libdir_of "$root")
	export PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$ld/pkgconfig" PKG_CONFIG_PATH=
	# shellcheck disable=SC2046
	c++ -std=c++20 -Wall -Wextra -Werror -o "$work/pc_static" "$src/tests/install/cxx_static/main.cpp" \
		$(pkg-config --cflags cxlkv) "$ld/libcxlkv.a" $(pkg-config --static --libs-only-l cxlkv | sed 's/-lcxlkv //') ||
		fail "pkg-config --static link"
	"$work/pc_static"
	;;
headers)
	# One compiler run per header and language, two at a time.
	inc=$root/usr/include
	{
		for h in "$inc"/cxlkv/*.h "$inc"/cxlkv/format/*.h; do echo "c ${h#"$inc"/cxlkv/}"; done
		for h in "$inc"/cxlkv/*.h "$inc"/cxlkv/format/*.h "$inc"/cxlkv/*.hpp; do echo "c++ ${h#"$inc"/cxlkv/}"; done
	} > "$work/list"
	n=$(wc -l < "$work/list")
	xargs -P 2 -L 1 sh -c '
		inc=$0 lang=$1 h=$2
		if [ "$lang" = c ]; then
			printf "#include <cxlkv/%s>\nint main(void) { return 0; }\n" "$h" |
				cc -x c -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$inc" - || { echo "FAIL: C: cxlkv/$h"; exit 255; }
		else
			printf "#include <cxlkv/%s>\nint main() { return 0; }\n" "$h" |
				c++ -x c++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$inc" - || { echo "FAIL: C++: cxlkv/$h"; exit 255; }
		fi' "$inc" < "$work/list" 2>&1 || fail "a header does not compile on its own"
	echo "$n header compilations on their own: ok"
	;;
symbols)
	ld=$(libdir_of "$root")
	sh "$src/tests/install/check_symbols.sh" "$ld/libcxlkv.so.0" "$root/usr/include/cxlkv"
	# The check is not vacuous: a library exporting more than cxlkv_* fails it.
	other=$(ldconfig -p | sed -n 's/.*libxxhash\.so\.0.* => //p' | head -n 1)
	if [ -n "$other" ] && sh "$src/tests/install/check_symbols.sh" "$other" "$root/usr/include/cxlkv" > "$work/other.log" 2>&1; then
		fail "check_symbols.sh accepted $other"
	fi
	;;
version)
	v=$(sed -n 's/^#define CXLKV_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$src/libruntime/include/cxlkv/version.h" | paste -sd.)
	echo "version.h: $v"
	for t in $(ls "$root/usr/bin"); do
		out=$(LD_LIBRARY_PATH=$(libdir_of "$root") "$root/usr/bin/$t" --version) || fail "$t --version exited $?"
		first=$(printf '%s\n' "$out" | head -n 1)
		# GNU form "TOOL (cxlkv) VERSION"; "TOOL VERSION" is accepted too.
		[ "$first" = "$t (cxlkv) $v" ] || [ "$first" = "$t $v" ] || fail "$t --version: '$first', want '$t (cxlkv) $v'"
		echo "$first"
	done
	if [ -x "$build/tools/cxlkv-bench" ]; then
		first=$("$build/tools/cxlkv-bench" --version | head -n 1)
		[ "$first" = "cxlkv-bench (cxlkv) $v" ] || fail "cxlkv-bench --version: '$first'"
	fi
	grep -q "^PACKAGE_VERSION=\"$v\"$" "$src/dkms.conf" || fail "dkms.conf PACKAGE_VERSION is not $v"
	grep -q "^version = \"$v\"$" "$src/libruntime/python/pyproject.toml" || fail "pyproject.toml version is not $v"
	dv=$(sed -n '1s/^cxlkv (\([^)-]*\).*/\1/p' "$src/debian/changelog")
	[ "$dv" = "$v" ] || fail "debian/changelog upstream version '$dv' is not $v"
	grep -q "^Version: $v$" "$(libdir_of "$root")/pkgconfig/cxlkv.pc" || fail "cxlkv.pc Version"
	;;
man)
	n=0
	for page in "$root"/usr/share/man/man*/*; do
		# groff -ww: all warnings; -z: no output; anything on stderr fails.
		groff -man -ww -z -Tutf8 "$page" > "$work/groff.out" 2>&1 || fail "groff $(basename "$page"): exit $?"
		[ ! -s "$work/groff.out" ] || { cat "$work/groff.out"; fail "groff warns about $(basename "$page")"; }
		MANWIDTH=80 man -l "$page" > "$work/page.txt" 2> "$work/man.err" || fail "man -l $(basename "$page")"
		[ ! -s "$work/man.err" ] || { cat "$work/man.err"; fail "man -l warns about $(basename "$page")"; }
		grep -q '^NAME' "$work/page.txt" || fail "$(basename "$page"): no NAME section"
		lines=$(wc -l < "$work/page.txt")
		[ "$lines" -gt 20 ] || fail "$(basename "$page"): only $lines lines"
		echo "$(basename "$page"): $lines lines"
		n=$((n + 1))
	done
	[ "$n" -ge 4 ] || fail "$n man pages installed, want 4"
	# The tool pages are the tools' own --help: every option is there.
	MANWIDTH=200 man -l "$root/usr/share/man/man8/cxlkvd.8" > "$work/cxlkvd.txt"
	for o in $("$root/usr/bin/cxlkvd" --help | grep -o -E '^  --[a-z-]+'); do
		grep -q -e "$o" "$work/cxlkvd.txt" || fail "cxlkvd(8) lacks $o"
	done
	MANWIDTH=200 man -l "$root/usr/share/man/man8/cxlkvctl.8" > "$work/cxlkvctl.txt"
	LD_LIBRARY_PATH=$(libdir_of "$root") "$root/usr/bin/cxlkvctl" --help | awk '/^Commands:/ { on = 1; next } on && /^  [a-z]/ { print substr($0, 3, 22) }' |
	while read -r cmd; do
		grep -q -e "$cmd" "$work/cxlkvctl.txt" || fail "cxlkvctl(8) lacks the command '$cmd'"
	done
	grep -q -e '--memtype' "$work/cxlkvctl.txt" || fail "cxlkvctl(8) lacks the options of its commands"
	;;
completion)
	comp=$root/usr/share/bash-completion/completions/cxlkvctl
	bc=/usr/share/bash-completion/bash_completion
	[ -r "$bc" ] || { echo "SKIP: bash-completion is not installed"; exit 77; }
	bash -n "$comp" || fail "syntax"
	# complete LINE: the completions bash offers for LINE (cursor at its end).
	cat > "$work/t.bash" <<TEST
. $bc
. $comp
export PATH="$root/usr/bin:\$PATH" LD_LIBRARY_PATH="$(libdir_of "$root")"
complete -p cxlkvctl > /dev/null || { echo "no completion registered"; exit 1; }
t() {
	local line=\$1 want=\$2
	COMP_LINE=\$line COMP_POINT=\${#line}
	read -r -a COMP_WORDS <<< "\$line"
	[[ \$line == *" " ]] && COMP_WORDS+=("")
	COMP_CWORD=\$((\${#COMP_WORDS[@]} - 1))
	COMPREPLY=()
	_cxlkvctl cxlkvctl "\${COMP_WORDS[COMP_CWORD]}" "\${COMP_WORDS[COMP_CWORD-1]}"
	local got="\${COMPREPLY[*]}"
	if [[ " \$got " != *" \$want "* ]]; then echo "'\$line' -> '\$got', want '\$want' among them"; exit 1; fi
	echo "'\$line' -> \$got"
}
t "cxlkvctl ca" carve
t "cxlkvctl carve " create
t "cxlkvctl carve cr" create
t "cxlkvctl --pool shm:x carve create --" --memtype
t "cxlkvctl carve create x --memtype " wc
t "cxlkvctl ind" index
t "cxlkvctl kv " check
t "cxlkvctl --j" --json
TEST
	bash "$work/t.bash"
	;;
python)
	py=/usr/bin/python3
	[ -x $py ] || { echo "SKIP: no /usr/bin/python3"; exit 77; }
	ld=$(libdir_of "$root")
	out=$(cd / && env -u CXLKV_LIB -u CXLKV_BUILD -u PYTHONPATH PYTHONPATH="$root/usr/lib/python3/dist-packages" LD_LIBRARY_PATH="$ld" \
		$py -c 'import cxlkv, cxlkv._lib as L; L.lib(); print(cxlkv.__file__); print([l.split()[-1] for l in open("/proc/self/maps") if "libcxlkv.so" in l][0])') ||
		fail "import cxlkv from the installed tree"
	echo "$out"
	case $out in "$root/usr/lib/python3/dist-packages/cxlkv/__init__.py"*) ;; *) fail "imported cxlkv from elsewhere" ;; esac
	case $out in *"
$ld/libcxlkv.so"*) ;; *) fail "the package loaded libcxlkv from elsewhere" ;; esac
	;;
make)
	# make install / uninstall with PREFIX and DESTDIR (-o build: use this build
	# tree as it is, do not build again from inside a test).
	d=$work/dest prefix=/opt/cxlkv-test
	make -s -C "$src" -o build BUILD="$build" PREFIX=$prefix DESTDIR="$d" install > "$work/install.log"
	ld=$(libdir_of "$d")
	case $ld in "$d$prefix"/*) ;; *) fail "library installed at $ld, not under PREFIX" ;; esac
	for f in bin/cxlkvctl include/cxlkv/cxlkv.h etc/cxlkv/cxlkvd.conf lib/systemd/system/cxlkvd.service share/man/man7/cxlkv.7; do
		[ -e "$d$prefix/$f" ] || fail "make install PREFIX=$prefix: $f not under PREFIX"
	done
	grep -q "^prefix=$prefix\$" "$ld/pkgconfig/cxlkv.pc" || fail "cxlkv.pc prefix"
	grep -q "^ExecStart=$prefix/bin/cxlkvd " "$d$prefix/lib/systemd/system/cxlkvd.service" || fail "unit ExecStart"
	outside=$(find "$d" -mindepth 1 -maxdepth 1 ! -name opt)
	[ -z "$outside" ] || fail "files outside PREFIX: $outside"
	n=$(find "$d" ! -type d | wc -l)
	echo "make install PREFIX=$prefix DESTDIR=...: $n files"
	touch "$d$prefix/bin/not-ours"
	make -s -C "$src" BUILD="$build" PREFIX=$prefix DESTDIR="$d" uninstall > "$work/uninstall.log"
	left=$(find "$d" ! -type d)
	[ "$left" = "$d$prefix/bin/not-ours" ] || fail "after make uninstall: $(echo "$left" | head)"
	[ ! -d "$d$prefix/include/cxlkv" ] || fail "include/cxlkv/ left behind"
	echo "make uninstall removed $n files, kept a file it did not install"
	;;
debs)
	for t in dpkg-buildpackage dh dh_dkms dh_python3 lintian; do
		command -v $t > /dev/null || fail "$t not found (make deps installs it)"
	done
	out=$build/deb
	# The packaging is what this checks (files, dependencies, lintian, the
	# library's symbols, the module's dkms build), not the code generation:
	# -O1 and no dbgsym packages take 9 minutes here where `make deb`'s
	# Debian defaults (-O2, dbgsym) take 15, inside CI's limit for `make test`.
	DEB_BUILD_OPTIONS="noautodbgsym ${DEB_BUILD_OPTIONS:-}" DEB_CFLAGS_APPEND="-O1 ${DEB_CFLAGS_APPEND:-}" \
		DEB_CXXFLAGS_APPEND="-O1 ${DEB_CXXFLAGS_APPEND:-}" sh "$src/packaging/make-deb.sh" "$out" > "$work/make-deb.log" 2>&1 || { tail -n 80 "$work/make-deb.log"; fail "make deb"; }
	grep '^make-deb: lintian' "$work/make-deb.log"
	sroot=$work/root
	for p in cxlkv-dkms libcxlkv0 libcxlkv-dev cxlkv-tools python3-cxlkv; do
		deb=$(ls "$out/${p}_"*.deb 2> /dev/null | head -n 1)
		[ -n "$deb" ] || fail "no $p package in $out"
		dpkg-deb -x "$deb" "$sroot"
		echo "$(basename "$deb"): $(dpkg-deb -f "$deb" Depends)"
	done
	ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
	for f in /usr/lib/$ma/libcxlkv.so.0 /usr/lib/$ma/libcxlkv.so /usr/lib/$ma/pkgconfig/cxlkv.pc \
		/usr/lib/$ma/cmake/cxlkv/cxlkvConfig.cmake /usr/include/cxlkv/cxlkv.h /usr/bin/cxlkvctl /usr/bin/cxlkvd \
		/usr/bin/cxlkv-replay /lib/systemd/system/cxlkvd.service /etc/cxlkv/cxlkvd.conf \
		/usr/share/man/man8/cxlkvctl.8.gz /usr/share/man/man7/cxlkv.7.gz /usr/share/bash-completion/completions/cxlkvctl \
		/usr/src/cxlkv-$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$src/dkms.conf")/dkms.conf \
		/usr/lib/python3/dist-packages/cxlkv/__init__.py; do
		[ -e "$sroot$f" ] || [ -L "$sroot$f" ] || fail "not in the packages: $f"
	done
	grep -q '^ExecStart=/usr/bin/cxlkvd ' "$sroot/lib/systemd/system/cxlkvd.service" || fail "unit ExecStart"
	dpkg-deb -c "$(ls "$out"/libcxlkv0_*.deb)" | grep -q 'libcxlkv.so.0 -> ' || fail "libcxlkv0 lacks the SONAME link"
	example_src
	export PKG_CONFIG_SYSROOT_DIR="$sroot" PKG_CONFIG_LIBDIR="$sroot/usr/lib/$ma/pkgconfig" PKG_CONFIG_PATH=
	cflags=$(pkg-config --cflags cxlkv) libs=$(pkg-config --libs cxlkv)
	echo "pkg-config --cflags --libs cxlkv: $cflags $libs"
	# shellcheck disable=SC2086
	cc -std=c11 -Wall -Wextra -Werror -o "$work/readme_example" "$work/readme_example.c" $cflags $libs
	check_linkage "$work/readme_example"
	LD_LIBRARY_PATH="$sroot/usr/lib/$ma" "$work/readme_example"
	for t in cxlkvctl cxlkvd cxlkv-replay; do
		"$sroot/usr/bin/$t" --version | head -n 1
	done
	sh "$src/tests/install/check_symbols.sh" "$sroot/usr/lib/$ma/libcxlkv.so.0" "$sroot/usr/include/cxlkv"
	# The module source of cxlkv-dkms builds the way dkms builds it: a copy
	# of /usr/src/cxlkv-VERSION, dkms.conf's MAKE[0] with ${kernel_source_dir}.
	kdir=$(ls -d /lib/modules/*/build 2> /dev/null | head -n 1)
	if [ -n "$kdir" ] && [ -e "$kdir/Makefile" ]; then
		cp -r "$sroot"/usr/src/cxlkv-* "$work/dkms-build"
		mk=$(sed -n 's/^MAKE\[0\]="\(.*\)"$/\1/p' "$work/dkms-build/dkms.conf")
		loc=$(sed -n 's/^BUILT_MODULE_LOCATION\[0\]="\(.*\)"$/\1/p' "$work/dkms-build/dkms.conf")
		(cd "$work/dkms-build" && kernel_source_dir=$(readlink -f "$kdir") && eval "$mk") > "$work/dkms-build.log" 2>&1 ||
			{ tail -n 30 "$work/dkms-build.log"; fail "dkms.conf's MAKE[0] did not build the module from /usr/src"; }
		[ -f "$work/dkms-build/$loc/cxlkv.ko" ] || fail "no $loc/cxlkv.ko after the dkms build"
		echo "cxlkv-dkms: $loc/cxlkv.ko built against $(readlink -f "$kdir")"
	else
		echo "cxlkv-dkms: no kernel headers in /lib/modules/*/build: module build not checked"
	fi
	;;
*)
	fail "unknown check '$check'"
	;;
esac
