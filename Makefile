# gpupool: `make run` starts gpupool, `make test` passes every test. Both set everything up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
SHARED ?= $(abspath ../shared)
FAKE_GPUS ?= 2xA100-80GB

.PHONY: install run demo test lint docs bench soak clean system-deps kube-deps run-k8s

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

# All-in-one: control plane on SQLite, one local agent with two clearly labelled FAKE GPUs (no real
# GPU needed; on a GPU machine run `.venv/bin/gpupool up` to use the GPUs NVML finds).
run: install
	$(VENV)/bin/gpupool up --data-dir gpupool-data --fake-gpus $(FAKE_GPUS)

demo: install
	$(VENV)/bin/gpupool sim demo --trace-dir $(SHARED)/traces/alibaba-gpu-v2023 --out demo-out

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src/gpupool/core
	$(VENV)/bin/lint-imports

# System packages the tests use: PostgreSQL (API tests run on it too), Chromium (dashboard tests, driven by
# Playwright; never `playwright install`) and gcc (the fake NVML library, preinstalled).
system-deps:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; } || \
	  echo "PostgreSQL is missing: its API tests will be skipped"
	@ls /usr/lib/chromium/chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
	  echo "Chromium is missing: the dashboard tests will be skipped"

# Kubernetes: the tests, `make run-k8s` and the k8s benchmark run a real kube-apiserver and kube-scheduler 1.20.2,
# built once from Debian's source package (about 4-8 minutes) and cached in ~/.cache/gpupool/k8s, with etcd-server.
kube-deps:
	@scripts/build-kube || echo "kube-apiserver could not be built: the Kubernetes tests will be skipped"

# A local Kubernetes control plane with 8 FAKE GPU nodes, scheduled by gpupool; prints the kubectl lines to try.
run-k8s: install kube-deps
	$(PY) -m gpupool.devtools.kube_demo --dir k8s-demo

# The docs site (mkdocs.yml): regenerate the CLI and settings references and the OpenAPI schema, then build site/.
# `make test` builds it with --strict too: a broken link, a missing page or a page left out of the nav fails.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
docs: install
	$(PY) -m gpupool.devtools.docgen
	$(MKDOCS)

test: lint system-deps kube-deps
	$(MKDOCS) --quiet
	GPUPOOL_SHARED=$(SHARED) $(PY) -m pytest -n 2 --dist worksteal -p no:cacheprovider

# Reliability soak (RELIABILITY.md §3.1, full counts: T1 100 kills / 500 jobs on SQLite and PostgreSQL, every
# migration kill point, longer disk-full holds) and the security tests of §3.2 that print figure lines. Every figure
# line the tests print lands in reports/reliability.md.
FIGURES := reports/.figures.txt
SECURITY := tests/server/test_isolation.py tests/server/test_fuzz.py tests/server/test_security.py tests/server/test_tenancy_security.py \
  tests/server/test_untrusted_input.py tests/server/test_workload_isolation.py tests/agent/test_runtime_container.py \
  tests/agent/test_toolkit_gate.py tests/agent/test_gpu_visibility.py tests/core/test_share_groups.py \
  tests/reliability/test_launch_inputs.py tests/agent/test_launch_refusal.py \
  tests/server/test_api_guard.py tests/dashboard/test_dashboard_guard.py \
  tests/reliability/test_node_identity.py \
  tests/sim/test_hostile_traces.py tests/sim/test_sim_csv_injection.py tests/server/test_statement_csv_injection.py tests/server/test_job_log_cap.py \
  tests/integration/test_process_job_identity.py \
  tests/server/test_cancel_race.py tests/server/test_cancel_final.py
soak: install system-deps
	mkdir -p reports && rm -f $(FIGURES)
	GPUPOOL_SOAK=1 GPUPOOL_FIGURES=$(abspath $(FIGURES)) GPUPOOL_SHARED=$(SHARED) \
	  $(PY) -m pytest tests/reliability $(SECURITY) -n 2 -p no:cacheprovider > reports/.soak.log 2>&1; status=$$?; \
	  tail -n 30 reports/.soak.log; \
	  $(PY) -m gpupool.devtools.figures $(FIGURES) reports/.soak.log --out reports/reliability.md \
	    --command "make soak"; exit $$status

bench: install kube-deps
	GPUPOOL_SHARED=$(SHARED) $(PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) demo-out sim-out gpupool-data site k8s-demo .mypy_cache .ruff_cache
