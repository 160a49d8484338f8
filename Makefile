# SPDX-License-Identifier: GPL-2.0
# p2pdirect. `make` builds the module (against the cached test kernel, or
# against KDIR=/path/to/a/Rust-enabled/kernel/build); `make demo` runs the
# main job in the test VM; `make check` runs every test.

all: module

module:
	@ci/build-module.sh

demo:
	@ci/demo.sh

check:
	@ci/check.sh

# The gdsio-style benchmark in the VM: results/bench-<date>/{bench.json,png}.
bench:
	@ci/bench.sh

# The ioctl fuzzer alone in the VM, for FUZZ_SECONDS (default 600), with
# FUZZ_SEED (default: a new one, printed) and FUZZ_THREADS (default 4).
fuzz:
	@ci/fuzz.sh

deps:
	@ci/install-deps.sh

kernel:
	@ci/build-kernel.sh >/dev/null

# Static checks of the sources: rustfmt and clippy on the userspace crate,
# rustfmt on the module, checkpatch-style C through the kernel's script.
lint:
	@ci/lint.sh

clean:
	@if [ -n "$(KDIR)" ]; then $(MAKE) -C "$(KDIR)" M=$(CURDIR) clean; fi
	rm -f *.o *.ko *.mod *.mod.c .*.cmd modules.order Module.symvers \
		rust/*.o rust/.*.cmd rust/ffi/*.o rust/ffi/.*.cmd rust/ffi/uapi_generated.rs
	$(MAKE) -C userspace-test/c clean KSRC=/nonexistent
	cd userspace-test/rust && cargo clean

.PHONY: all module demo check bench fuzz deps kernel lint clean
