# SPDX-License-Identifier: GPL-2.0
# p2pdirect. `make` builds the module (against the cached test kernel, or
# against KDIR=/path/to/a/Rust-enabled/kernel/build); `make demo` runs the
# main job in the test VM; `make check` runs every test.

# KVER=7.3 builds and tests against that kernel series instead of the default
# (ci/kernel-series.txt); IOMMU=1 runs the VM with QEMU's intel-iommu.
ifneq ($(KVER),)
export P2PDIRECT_KERNEL_SERIES := $(KVER)
endif
ifneq ($(IOMMU),)
export P2PDIRECT_IOMMU := $(IOMMU)
endif

all: module

module:
	@ci/build-module.sh

demo:
	@ci/demo.sh

# Every suite, whatever P2PDIRECT_ONLY says (it is for ci/vm.sh, make bench
# and make profile).
check:
	@env -u P2PDIRECT_ONLY ci/check.sh

# What CI runs: `make check` on every kernel series, and with an IOMMU.
check-matrix:
	@env -u P2PDIRECT_ONLY ci/check-matrix.sh

# The gdsio-style benchmark in the VM: results/bench-<date>/bench.{json,txt,svg,png}.
bench:
	@ci/bench.sh

# Where the guest's CPU time goes in bench workloads (perf in the VM):
# results/profile-<date>/profile.txt; P2PDIRECT_ONLY=path/workload,... chooses.
profile:
	@ci/profile.sh

# The ioctl fuzzer alone in the VM, for FUZZ_SECONDS (default 600), with
# FUZZ_SEED (default: a new one, printed) and FUZZ_THREADS (default 4).
fuzz:
	@ci/fuzz.sh

deps:
	@ci/install-deps.sh

kernel:
	@ci/build-kernel.sh >/dev/null

# Static checks of the sources: rustfmt and clippy on the module and on the
# userspace crate, the module's layering (ci/layering.py), checkpatch on the C
# files through the kernel's script.
lint:
	@ci/lint.sh

clean:
	@if [ -n "$(KDIR)" ]; then $(MAKE) -C "$(KDIR)" M=$(CURDIR) clean; fi
	rm -f *.o *.ko *.mod *.mod.c .*.cmd modules.order Module.symvers \
		rust/*.o rust/.*.cmd rust/ffi/*.o rust/ffi/.*.cmd rust/ffi/uapi_generated.rs rust/ffi/shim_generated.rs \
		testmod/*.o testmod/.*.cmd testmod/*.ko testmod/*.mod testmod/*.mod.c \
		testmod/modules.order testmod/Module.symvers
	$(MAKE) -C userspace-test/c clean KSRC=/nonexistent
	cd userspace-test/rust && cargo clean

.PHONY: all module demo check check-matrix bench profile fuzz deps kernel lint clean
