# carbd — see README.md. Every target works on a fresh Debian 12 machine
# after `make setup` (run as root, or with sudo available).

GO       ?= go
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PKGS := clang-14 llvm-14 libbpf-dev bpftool iptables nftables iperf3 \
            busybox-static cpio qemu-system-x86 qemu-system-common qemu-utils \
            socat curl dnsutils iputils-ping netcat-openbsd tcpdump tshark \
            iproute2 kmod ca-certificates make
BIN      := bin/carbd

.PHONY: all setup build test test-fresh test-short bench demo generate check-generated fuzz fuzz-long clean vmimage

all: build

## setup: install every Debian package and Go module the project needs
setup:
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PKGS)
	$(GO) mod download
	$(GO) build -o /dev/null ./...

## build: the static carbd binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/carbd

## test: every test; privileged ones run as root (CI) and skip otherwise;
##       the committed eBPF objects must match their sources. It starts
##       with test-fresh, so every run starts from a new machine's state.
test: check-generated test-fresh
	$(GO) vet ./...
	CARBD_CI=$${CARBD_CI:-} $(GO) test -count=1 -timeout 20m ./...

## test-fresh: put the machine, for what the tests are known to depend on,
##       in the state of a new one (.ci/fresh-state): remove /run/virtiofsd
##       (virtiofsd's first start makes it; no virtiofsd may be running),
##       unload 8021q when loaded and unused, forwarding sysctls off unless a
##       live carbd holds them. Failures seen only on a machine's first run
##       then show on every run. A no-op when not root.
test-fresh:
	$(SUDO) .ci/fresh-state

## test-short: the unprivileged unit tests only
test-short:
	$(GO) test -short ./pkg/decide/... ./pkg/calib/...

## bench: run the benchmarks and write docs/bench-report.md with ratios
bench:
	$(GO) run ./internal/benchreport -o docs/bench-report.md

## demo: the README's first command: a scripted agent in the netns sandbox
##       tries to leak a private key through a note and a POST; carbd stops it
demo: build
	$(SUDO) $(BIN) demo

## generate: rebuild the eBPF objects and Go bindings with clang-14
generate:
	$(GO) generate .

## check-generated: fail when committed generated files are stale
check-generated: generate
	git diff --exit-code -- bpf/

## fuzz: run each fuzz target for FUZZTIME (default 30s), stop at the first failure
FUZZPARALLEL ?= 1
fuzz:
	@for p in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$p 2>/dev/null | grep ^Fuzz); do \
	    echo "== $$p $$f"; $(GO) test -run=^$$ -fuzz=^$$f$$ -fuzztime=$(or $(FUZZTIME),30s) -parallel=$(FUZZPARALLEL) $$p || exit 1; \
	  done; done

## fuzz-long: every fuzz target for FUZZTIME (default 10m) with -parallel=FUZZPARALLEL
##       (default 1, fits 2 cores); writes the report into FUZZREPORT
##       (default docs/fuzzing.md, between its fuzz-report markers)
FUZZREPORT ?= docs/fuzzing.md
FUZZPKGS ?= ./...
fuzz-long:
	$(GO) run ./internal/fuzzreport -fuzztime $(or $(FUZZTIME),10m) -parallel $(FUZZPARALLEL) -o $(FUZZREPORT) $(FUZZPKGS)

## vmimage: the guest image (kernel, initramfs, vmlinux) in vmimage/out/
vmimage:
	$(MAKE) -C vmimage GO=$(GO)

clean:
	rm -rf bin
