# bulkinfer: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# import circles between our own modules (lazy imports count): the team's tool beside the checkout, else our copy
CIRCLES := $(firstword $(wildcard ../shared/tools/circles.py) tools/circles.py)
DEMO   := demo
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install system demo demo-recommend test lint docs bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: its CPU build comes from a local wheel; an unpinned pull would fetch CUDA.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet torch==2.13.0 -e '.[dev,images,science,vectors,feast]'
	# RapidOCR 1.4 ships its PP-OCRv4 models; --no-deps keeps its opencv-python out (the images extra's
	# opencv-python-headless is the one cv2, NudeNet's), its other requirements are in the extra
	$(PY) -m pip install --quiet --no-deps 'rapidocr-onnxruntime==1.4.4'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/make_catalog.py $(DEMO)/catalog.parquet 20000
	$(VENV)/bin/bulkinfer run examples/catalog.toml
	$(VENV)/bin/bulkinfer inspect $(DEMO)/embeddings
	@echo "results: $(DEMO)/embeddings/part-*.parquet (manifest: $(DEMO)/embeddings/_SUCCESS, report: $(DEMO)/embeddings/_bulkinfer/report.json)"

demo-recommend: $(STAMP)
	$(PY) examples/recommend/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy
	$(PY) $(CIRCLES) src/bulkinfer
	$(PY) $(CIRCLES) src/bulkinfer --packages

# the manual: a broken link or anchor fails the build (strict)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# what the suite needs from the system (chromium, a C compiler), installed when missing
system:
	bash tools/system_deps.sh

# the tests start hundreds of Python processes (the CLI, servers, Ray and Spark workers): compiled
# once here, bulkinfer's modules are read from bytecode by each of them, also where the
# environment sets PYTHONDONTWRITEBYTECODE (then nothing else would ever write it)
test: $(STAMP) system lint docs
	$(PY) -m compileall -q src tests examples
	# every test's time in .ci/junit.xml (the slow ones visible after any run), the 25 slowest printed
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 --junitxml=.ci/junit.xml

bench: $(STAMP)
	$(PY) bench/bench_run.py 5000 --repeat 3
	$(PY) bench/bench_tabular.py 1000000 --repeat 3
	$(PY) bench/bench_serve.py
	$(PY) bench/bench_exports.py 20000 --job-rows 2000
	$(PY) bench/bench_index.py 50000 20000
	$(PY) bench/bench_incremental.py 20000
	$(PY) bench/bench_planning.py 10000 2000
	$(PY) bench/bench_int8_static.py 2000 128
	$(PY) bench/bench_spark.py 3000 --rounds 2

clean:
	rm -rf $(VENV) $(DEMO) site bench/_work .pytest_cache .mypy_cache .ruff_cache .hypothesis
