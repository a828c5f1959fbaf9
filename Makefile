# The two commands a newcomer needs: `make run` and `make test`. Everything else is theirs.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: test run lint unit vm vm-smoke bench host-packages clean deb

# systemd-python compiles against libsystemd; the VM harness needs nspawn and debootstrap.
host-packages:
	@missing=""; \
	for package in libsystemd-dev pkg-config gcc systemd-container debootstrap; do \
	    dpkg -s $$package >/dev/null 2>&1 || missing="$$missing $$package"; \
	done; \
	if [ -n "$$missing" ]; then \
	    echo "Installing$$missing with apt-get"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(VENV)/.ready: pyproject.toml | host-packages
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check boxd testbed tests bench
	$(VENV)/bin/ruff format --check boxd testbed tests bench
	$(VENV)/bin/mypy --strict

unit: $(VENV)/.ready
	$(PY) -m pytest -q tests --ignore=tests/vm

# The VM suite whole on Debian's current stable release, and its smoke tests on the release
# before (testbed/image.py builds each release's image; docs/testing.md).
vm: $(VENV)/.ready
	BOXD_SUITE=trixie $(PY) -m pytest -q tests/vm

vm-smoke: $(VENV)/.ready
	BOXD_SUITE=bookworm $(PY) -m pytest -q -m smoke tests/vm

# The images and the .deb are made while lint and the unit tests run (testbed/prepare.py): on a
# fresh machine they are minutes that the VM suites would otherwise wait for.
test: $(VENV)/.ready
	@mkdir -p build
	$(PY) -m testbed.prepare > build/prepare.log 2>&1 & prepare=$$!; \
	$(MAKE) --no-print-directory lint unit; status=$$?; \
	wait $$prepare; cat build/prepare.log; \
	[ $$status = 0 ] && $(MAKE) --no-print-directory vm vm-smoke

run: $(VENV)/.ready
	$(PY) -m testbed.run_box

# boxd's Debian package, in build/deb: `make deb VERSION=0.1.0+2` builds this tree as another
# version (debian/make-deb).
deb:
	debian/make-deb $(if $(VERSION),--version $(VERSION))

bench: $(VENV)/.ready
	$(PY) -m bench.start_latency

clean:
	rm -rf $(VENV) build dist *.egg-info
