# quotad: run `make help` for the targets.
SHELL      := /bin/bash
GO         ?= go
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT     ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS    := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN        := bin/quotad
SOCKET     ?= ./quotad.sock
FUZZTIME   ?= 200000x

.PHONY: help build run test fuzz lint test-deps clean cluster sentinel bench

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/quotad
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) .

run: build ## run the sidecar on ./quotad.sock (embedded store unless QUOTAD_REDIS_URL is set)
	QUOTAD_SOCKET=$${QUOTAD_SOCKET:-$(SOCKET)} QUOTAD_LOG_FORMAT=$${QUOTAD_LOG_FORMAT:-console} ./$(BIN) serve

cluster: ## start a local Redis Cluster (3 masters, 3 replicas) until Ctrl-C; prints the URL for make run
	$(GO) run ./integration/redistest/cmd/redistopo cluster

sentinel: ## start a local master, replica and 3 sentinels until Ctrl-C; prints the URL for make run
	$(GO) run ./integration/redistest/cmd/redistopo sentinel

test: test-deps lint ## every test, with the race detector, plus a short fuzz run of the codec
	$(GO) test -race -count=1 ./...
	$(MAKE) --no-print-directory fuzz

fuzz: ## run each codec fuzz target for FUZZTIME executions (default 200000x; a duration such as 5m also works)
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=$(FUZZTIME) ./protocol/
	$(GO) test -run='^$$' -fuzz='^FuzzLineReader$$' -fuzztime=$(FUZZTIME) ./protocol/
	$(GO) test -run='^$$' -fuzz='^FuzzRequest$$' -fuzztime=$(FUZZTIME) ./rls/
	$(GO) test -run='^$$' -fuzz='^FuzzCodecMatchesProto$$' -fuzztime=$(FUZZTIME) ./rls/

bench: build ## measure quotad against an in-process client on a private redis-server (BENCH_DURATION=5s BENCH_ROUNDS=3; BENCH_ROWS=regexp measures only those rows; BASELINE=path measures a second build beside it)
	$(GO) run ./integration/bench -quotad $(BIN) $(if $(BASELINE),-baseline $(BASELINE))

lint: ## gofmt and go vet
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# helm and kustomize render the chart and the kustomizations in deploy/'s
# tests, which install the same versions into the same directory themselves
# when this has not run.
TOOLS_BIN     ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/quotad-tools/bin
HELM_PKG      := helm.sh/helm/v3/cmd/helm@v3.22.0
KUSTOMIZE_PKG := sigs.k8s.io/kustomize/kustomize/v5@v5.8.2

test-deps: ## make sure redis-server, python3 (venv, wheel, mypy), node, npm and OpenBSD nc (the README's) are installed (apt-get when root), and build helm and kustomize
	GOBIN=$(TOOLS_BIN) $(GO) install $(HELM_PKG)
	GOBIN=$(TOOLS_BIN) $(GO) install $(KUSTOMIZE_PKG)
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v python3 >/dev/null 2>&1 || missing="$$missing python3"; \
	python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	ls /usr/share/python-wheels/wheel-*.whl >/dev/null 2>&1 || missing="$$missing python3-wheel-whl"; \
	command -v mypy >/dev/null 2>&1 || missing="$$missing mypy"; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	nc -h 2>&1 | grep -q -e '-N' || missing="$$missing netcat-openbsd"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing$$missing with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "missing:$$missing. Install them (Debian/Ubuntu: sudo apt-get install$$missing) and run make test again" >&2; exit 1; \
	fi

clean: ## remove build output
	rm -rf bin $(SOCKET)
