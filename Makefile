# cxlkv top-level Makefile.  Userspace is built by CMake into $(BUILD);
# the kernel module by Kbuild in kmod/.
#
#   make run     set-up, build, run the main job on an embedded shm pool
#   make test    set-up, build, run every test (unit, multi-process, model, VM)
#   make bench   benchmarks -> build/bench/results.json
#   make soak    the full-pool kill soak alone (CXLKV_SOAK_SECONDS, default 180)
#   make deps    install missing Debian packages (root) or print the command
#   make kmod    build kmod/cxlkv.ko (KDIR= to choose the kernel tree)
#   make install    library, headers, cxlkv.pc, CMake package, tools, man pages,
#                   systemd unit, module source for dkms, Python package
#                   (PREFIX=/usr/local, DESTDIR=); make uninstall removes them
#   make deb     Debian packages -> $(BUILD)/deb/*.deb (dpkg-buildpackage, lintian)
#   make clean

BUILD    ?= build
JOBS     ?= $(shell nproc)
CMAKE    ?= cmake
CMAKE_FLAGS ?=
PREFIX   ?= /usr/local
DESTDIR  ?=
export CXLKV_BUILD := $(abspath $(BUILD))

.PHONY: all deps configure build test unit-test run bench soak clean kmod vm-test help install uninstall deb

all: build

help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

deps:
	@tools/scripts/deps.sh
	@tools/scripts/engines.sh

configure: deps
	@$(CMAKE) -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@$(CMAKE) --build $(BUILD) -j$(JOBS)

unit-test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 900
	@cat $(BUILD)/tests/python/*/pytest.log 2>/dev/null || true
	@cat $(BUILD)/tests/engines/*.log 2>/dev/null || true

test: unit-test
	@tools/scripts/maybe-vm-test.sh

run: build
	@tools/scripts/run.sh

bench: build
	@mkdir -p $(BUILD)/bench
	@tools/scripts/bench.sh

soak: build
	@tools/scripts/soak.sh

kmod:
	$(MAKE) -C kmod

# The prefix is applied at install time (cmake --install --prefix), so one
# build installs anywhere; the build's own CMAKE_INSTALL_PREFIX is not used.
install: build
	DESTDIR="$(DESTDIR)" $(CMAKE) --install $(BUILD) --prefix "$(PREFIX)"

uninstall:
	@packaging/uninstall.sh $(BUILD) "$(PREFIX)" "$(DESTDIR)"

deb: deps
	@packaging/make-deb.sh $(BUILD)/deb

vm-test: build kmod
	tests/vm/run.sh

clean:
	rm -rf $(BUILD)
	-$(MAKE) -C kmod clean
