# carbd — see README.md. Every target works on a fresh Debian 12 machine
# after `make setup` (run as root, or with sudo available).

GO       ?= go
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PKGS := clang-14 llvm-14 libbpf-dev bpftool iptables nftables iperf3 \
            busybox-static cpio qemu-system-x86 qemu-system-common qemu-utils \
            socat curl dnsutils iputils-ping netcat-openbsd tcpdump tshark \
            iproute2 kmod ca-certificates make zsh fish groff-base mitmproxy \
            git python3 python3-requests nodejs libhyperscan-dev
BIN      := bin/carbd

.PHONY: all setup build install deb lint test test-fresh test-short e2e soak bench demo generate check-generated fuzz fuzz-long clean vmimage

all: build

## setup: install every Debian package and Go module the project needs
setup:
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PKGS)
	$(GO) mod download
	$(GO) build -o /dev/null ./...

## build: the static carbd binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -o $(BIN) ./cmd/carbd

## install: carbd, its manual page and shell completions under PREFIX
PREFIX  ?= /usr/local
DESTDIR ?=
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/carbd
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
	           $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	$(BIN) man | gzip -9n > $(DESTDIR)$(PREFIX)/share/man/man1/carbd.1.gz
	$(BIN) completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/carbd
	$(BIN) completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_carbd
	$(BIN) completion fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/carbd.fish

## deb: a Debian package of the static binary, manual and completions in
##      bin/ (dpkg-deb); its version comes from git
DEB_VERSION ?= $(shell git log -1 --format=0.0~git%cd.%h --date=format:%Y%m%d 2>/dev/null || echo 0.0)
deb: build
	rm -rf bin/deb && mkdir -p bin/deb/DEBIAN
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/bin/deb PREFIX=/usr
	install -D -m 0644 examples/policy.yaml bin/deb/usr/share/doc/carbd/examples/policy.yaml
	install -D -m 0644 README.md bin/deb/usr/share/doc/carbd/README.md
	printf 'Package: carbd\nVersion: %s\nArchitecture: amd64\nMaintainer: carbd developers <carbd@localhost>\nSection: admin\nPriority: optional\nDepends: iptables, iproute2\nRecommends: qemu-system-common, tshark\nDescription: enforcement layer for AI agents in sandboxes\n carbd keeps every effect of an AI agent (requests, file writes) out of\n the world until it has decided, by policy, provenance and calibrated\n risk control.\n' '$(DEB_VERSION)' > bin/deb/DEBIAN/control
	dpkg-deb --root-owner-group --build bin/deb bin/carbd_$(DEB_VERSION)_amd64.deb
	dpkg-deb --contents bin/carbd_$(DEB_VERSION)_amd64.deb | grep './usr/bin/carbd$$' >/dev/null

## test: every test; privileged ones run as root (CI) and skip otherwise;
##       the committed eBPF objects must match their sources. It starts
##       with test-fresh, so every run starts from a new machine's state.
test: check-generated test-fresh lint
	CARBD_CI=$${CARBD_CI:-} $(GO) test -count=1 -timeout 20m ./...

## lint: gofmt, go vet, staticcheck (pinned as a tool in go.mod) and a
##       tidy go.mod, as make test runs them
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./internal/e2e/...
	$(GO) tool staticcheck ./...
	$(GO) mod tidy -diff

## test-fresh: put the machine, for what the tests are known to depend on,
##       in the state of a new one (.ci/fresh-state): remove /run/virtiofsd
##       (virtiofsd's first start makes it; no virtiofsd may be running),
##       unload 8021q when loaded and unused, forwarding sysctls off unless a
##       live carbd holds them. Failures seen only on a machine's first run
##       then show on every run. A no-op when not root.
test-fresh:
	$(SUDO) .ci/fresh-state

## e2e: a real coding agent (Codex CLI from npm, pinned in
##      internal/e2e/agent, installed under E2E_DIR) inside `carbd run` with
##      examples/policy.yaml, against a scripted model server (root). Node
##      and npm come from Debian when the machine has none.
E2E_DIR ?= /var/lib/carbd-e2e
e2e:
	command -v npm >/dev/null || $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
	$(SUDO) mkdir -p $(E2E_DIR)
	$(SUDO) cp internal/e2e/agent/package.json internal/e2e/agent/package-lock.json $(E2E_DIR)/
	cd $(E2E_DIR) && $(SUDO) npm ci --no-audit --no-fund --loglevel=error
	$(GO) vet -tags e2e ./internal/e2e/...
	CARBD_CODEX=$(E2E_DIR)/node_modules/.bin/codex $(GO) test -tags e2e -count=1 -v -timeout 15m ./internal/e2e/...

## soak: SOAK_RUNS (default 200) consecutive carbd runs in one git working
##       directory with a scripted coding agent and a person editing it too;
##       checks nothing is lost or leaks and writes per-run figures of what
##       accumulates (docs/soak.md; root; about 2 s a run)
SOAK_RUNS ?= 200
soak:
	$(GO) test -tags soak -count=1 -timeout 0 -v ./internal/soak -soak.runs $(SOAK_RUNS)

## test-short: the unprivileged unit tests only
test-short:
	$(GO) test -short ./pkg/decide/... ./pkg/calib/...

## bench: run the benchmarks and write docs/bench-report.md with ratios
##        (goal: under 15 minutes; the report opens with where they go).
##        BENCHFLAGS is passed on, e.g. "-count 5", or "-only netparse,calib
##        -o /tmp/part.md" for some suites (-only alone overwrites the report)
bench:
	$(GO) run ./internal/benchreport -o docs/bench-report.md $(BENCHFLAGS)

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
