# minibroker: every target that needs the environment installs it first, so a fresh clone needs
# no other step. The venv is rebuilt only when pyproject.toml, setup.py or a C extension's source
# changes (the stamp file): an editable install does not rebuild C by itself; installing again does.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
EXTRAS  ?= dev,spark
PYTEST_ARGS ?=
SEEDS   ?= 500

.PHONY: install test test-unit test-integration lint mypy proto proto-check bench sim sim-quorum demo verify clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard client/records/*.c)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	@# The compiled record codec is optional for users (no compiler: pure fallback), never here.
	$(BIN)/python -c "import minibroker.client.records._encoder, minibroker.client.records._decoder"
	@touch $(STAMP)

# Three pytest processes at once, so the suite takes about the longest of the three instead of
# their sum: the real-process integration tests in two halves of about equal time (INTEGRATION_A
# are the longest modules, about half of it: 12 of 24 minutes in one loaded run); in the third
# the in-process tests (unit, the seeded simulations, packaging), then the Spark and Docker ones
# (real processes too, but mostly waiting on the JVM, image builds and the disk). Each picks
# free ports from its own third of the range (MINIBROKER_PORT_SLICE, deploy/cluster.py), so a
# port one keeps for a stopped process is never another's. The status is the first failure.
INPROCESS := tests/unit tests/sim tests/test_packaging.py tests/spark \
	tests/integration/test_docker.py tests/integration/test_compose.py
INTEGRATION_A := $(addprefix tests/integration/,test_network_partitions.py test_verify.py \
	test_launcher.py test_cleaner_broker_crash.py test_replication.py test_launcher_add_broker.py \
	test_reassignment_process.py test_consumer_truncation.py test_controller_process.py \
	test_quorum_cluster.py)
test: install
	@MINIBROKER_PORT_SLICE=0/3 $(BIN)/python -m pytest $(INPROCESS) $(PYTEST_ARGS) & inprocess=$$!; \
	MINIBROKER_PORT_SLICE=1/3 $(BIN)/python -m pytest $(INTEGRATION_A) $(PYTEST_ARGS) & half=$$!; \
	MINIBROKER_PORT_SLICE=2/3 $(BIN)/python -m pytest tests/integration $(addprefix --ignore=,$(filter tests/integration/%,$(INPROCESS)) $(INTEGRATION_A)) \
	  $(PYTEST_ARGS); status=$$?; \
	wait $$half || status=$$((status ? status : 1)); \
	wait $$inprocess || status=$$((status ? status : 1)); exit $$status

test-unit: install
	$(BIN)/python -m pytest tests/unit tests/sim $(PYTEST_ARGS)

test-integration: install
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# Every seeded simulation under tests/sim runs SEEDS seeds: the replication one (200 when SEEDS
# is unset, as in `make test`, spread over one worker process per core; MINIBROKER_SIM_WORKERS=N
# overrides, MINIBROKER_SIM_SEED=N runs one seed) and the controller quorum's
# (tests/sim/test_quorum_sim.py; 300 seeds when SEEDS is unset).
sim: install
	MINIBROKER_SIM_SEEDS=$(SEEDS) $(BIN)/python -m pytest tests/sim -q $(PYTEST_ARGS)

sim-quorum: install
	MINIBROKER_QUORUM_SIM_SEEDS=$(SEEDS) $(BIN)/python -m pytest tests/sim/test_quorum_sim.py -q $(PYTEST_ARGS)

lint: install proto-check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@$(MAKE) --no-print-directory mypy

# Imports use the installed names (minibroker.broker, ...), which pyproject.toml's package-dir maps
# onto the repository's folders; mypy cannot map names that way, so it checks a view that has
# them: build/mypy/minibroker/<pkg> links to ./<pkg> (errors name files under minibroker/).
MYPY_VIEW := build/mypy
mypy: install
	rm -rf $(MYPY_VIEW) && mkdir -p $(MYPY_VIEW)/minibroker
	for pkg in broker client controller deploy metadata proto; do \
	  ln -s ../../../$$pkg $(MYPY_VIEW)/minibroker/$$pkg; done
	ln -s ../../examples $(MYPY_VIEW)/examples
	cd $(MYPY_VIEW) && ../../$(BIN)/mypy --config-file ../../pyproject.toml minibroker examples

# protoc's -I VIRTUAL=DISK mapping compiles proto/x.proto as minibroker/proto/x.proto, so the
# generated imports read `from minibroker.proto import x_pb2` (docs/design.md §1).
GEN := .proto-gen
proto: install
	rm -rf $(GEN) && mkdir $(GEN)
	$(BIN)/python -m grpc_tools.protoc -Iminibroker/proto=proto \
	  --python_out=$(GEN) --grpc_python_out=$(GEN) --pyi_out=$(GEN) proto/*.proto
	cp $(GEN)/minibroker/proto/*.py $(GEN)/minibroker/proto/*.pyi proto/
	rm -rf $(GEN)

proto-check: proto
	git diff --exit-code -- proto/

bench: install
	$(BIN)/minibroker bench log

demo: install
	$(BIN)/minibroker demo $(DEMO_ARGS)

# A 10-minute Jepsen-style run on a temporary cluster, every fault kind (100+ rounds); exit 1 on
# any violation, with the seed that reproduces it. VERIFY_ARGS adds options (--seed N, --json).
verify: install
	$(BIN)/minibroker verify --fresh --duration 600s $(VERIFY_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .proto-gen build *.egg-info client/records/*.so
