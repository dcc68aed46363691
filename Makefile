# The two quick-start commands: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PORT ?= 8787
DATA_DIR ?= ./.titen

.PHONY: run test setup bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/titen demo --data-dir $(DATA_DIR) --port $(PORT)
	$(BIN)/titen serve --data-dir $(DATA_DIR) --port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -n auto

clean:
	rm -rf $(VENV) $(DATA_DIR) build *.egg-info
