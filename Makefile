# forkbox. Run as root: sandboxes need namespaces, cgroups and mounts.
#   make run    install packages, build, start `forkbox serve` and run a demo
#   make test   lint, install packages, build, run every test (real sandboxes)
#   make lint   gofmt, then staticcheck (pinned below; staticcheck.conf) over the module
#   make bench  benchmark forkbox beside podman and the runc CLI

export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
GO        ?= go
BIN       := bin
DATA_DIR  ?= /var/lib/forkbox
LISTEN    ?= 127.0.0.1:7070
STORAGE_GIB ?= 16
TEST_FLAGS ?= -count=1 -timeout 18m
# The linter, pinned: go run fetches this version from the module proxy
# (checked against the checksum database) without adding it to go.mod.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all deps build test run bench generate vet lint clean

all: build

deps:
	./scripts/install-deps.sh

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/forkbox ./cmd/forkbox-agent

vet:
	$(GO) vet ./...

# gofmt, then staticcheck (which compiles the tests too, so it also covers
# e2e/).
lint:
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then \
		echo "lint: not gofmt-formatted:"; echo "$$unformatted"; exit 1; fi
	$(GO) run $(STATICCHECK) ./...

# The linter first, then every package but the end-to-end tests, then the
# end-to-end tests on their own against the default storage driver (btrfs;
# alone, so that the benchmark's test, which loads the host with its peers
# for minutes, does not run beside them), then the storage-dependent ones
# again on overlay,
# then the exec, files, snapshot, fork, merge, isolation, disk and E2B tests with
# the API in front of a second Node implementation (e2e/forward_test.go;
# the sandbox port tests too),
# which proves the API's seam, and with spare sandboxes on (their
# sessions then take spares' places: e2e/spare_test.go).
test: deps lint build vet
	FORKBOX_AGENT=$(CURDIR)/$(BIN)/forkbox-agent FORKBOX_BIN=$(CURDIR)/$(BIN)/forkbox \
		$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v '/e2e$$')
	FORKBOX_AGENT=$(CURDIR)/$(BIN)/forkbox-agent FORKBOX_BIN=$(CURDIR)/$(BIN)/forkbox \
		$(GO) test $(TEST_FLAGS) ./e2e/
	FORKBOX_AGENT=$(CURDIR)/$(BIN)/forkbox-agent FORKBOX_BIN=$(CURDIR)/$(BIN)/forkbox FORKBOX_STORAGE=overlay \
		$(GO) test $(TEST_FLAGS) -run 'Snapshot|Fork|Merge|Pause|Disk|Pool|Destroy|Restart|Files' ./e2e/
	FORKBOX_AGENT=$(CURDIR)/$(BIN)/forkbox-agent FORKBOX_BIN=$(CURDIR)/$(BIN)/forkbox FORKBOX_E2E_NODE=forward FORKBOX_E2E_SPARES=4 \
		$(GO) test $(TEST_FLAGS) -run '^Test(Exec|Files|Snapshot|Fork|Merge|E2B|Isolation|Disk|SandboxPorts|PortForward)' ./e2e/

run: deps build
	DATA_DIR=$(DATA_DIR) LISTEN=$(LISTEN) STORAGE_GIB=$(STORAGE_GIB) ./scripts/run-demo.sh

bench: deps build
	$(BIN)/forkbox bench

generate:
	FORKBOX_GENERATE=1 ./scripts/install-deps.sh
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
	protoc -I proto/envd --go_out=. --go_opt=module=github.com/forkbox/forkbox \
		--connect-go_out=. --connect-go_opt=module=github.com/forkbox/forkbox \
		proto/envd/process/process.proto proto/envd/filesystem/filesystem.proto

clean:
	rm -rf $(BIN)
