# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
# test processes of `make test` (tests/conftest.py groups the Ray tests)
TEST_PROCESSES ?= 3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-all install bytecode lint bench bench-video bench-video-user bench-video-many bench-peers bench-shots bench-curator bench-semdedup clean

# The overlay-text filter uses only the text detection model (an ONNX file) inside
# rapidocr-onnxruntime, never its code: --no-deps keeps its dependencies out (OpenCV's GUI
# build among them, whose cv2 would replace opencv-python-headless's and needs libGL), and
# the model does not care which Python reads it
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,ray,video,image,s3,text,metrics,dedup]'
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python 'rapidocr-onnxruntime>=1.4'
	touch $(STAMP)

install: $(STAMP)

# pip writes the bytecode of what it installs; a copy of the venv that lost its __pycache__
# folders (a snapshot that drops them; PYTHONDONTWRITEBYTECODE=1 keeps them from coming back)
# makes every process compile torch, Ray, PyAV... again as it starts: 1.8x the CPU of the test
# suite (docs/measurements/2026-11-28-bytecode.md). Compiled again where it is missing (the
# check takes a tenth of a second), and conveyor's own modules (an editable install has none)
bytecode: $(STAMP)
	@$(PY) benchmarks/_bytecode.py || { echo "compiling $(VENV)'s bytecode, which is missing"; \
		$(PY) -m compileall -qq -j 0 $(VENV)/lib >/dev/null || true; }
	@$(PY) -m compileall -qq -j 0 conveyor >/dev/null || true

demo: bytecode
	$(VENV)/bin/conveyor demo

# `make test` leaves out the tests marked slow (end-to-end pipelines on Ray clusters,
# kill-and-resume runs, the benchmarks' smoke runs: 43% of the suite's CPU) so that it
# takes minutes on 2 cores; `make test-slow` runs those, `make test-all` everything (.ci/run).
# Each prints its 15 slowest tests, to keep the budget in sight
test: TEST_SELECTION := not slow
test-slow: TEST_SELECTION := slow
test-all: TEST_SELECTION :=

# The report tests open pages in Debian's Chromium; where it is missing and apt-get can run,
# it is installed here (elsewhere those tests skip and say why)
test test-slow test-all: export DEBIAN_FRONTEND=noninteractive
test test-slow test-all: bytecode
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { apt-get install -y -qq chromium >/dev/null 2>&1 \
		|| { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; } \
		|| echo "chromium not installed: the report's browser tests will skip"; }
	$(VENV)/bin/ruff check conveyor tests benchmarks examples
	$(PY) -m pytest -q -n $(TEST_PROCESSES) --dist loadgroup -m "$(TEST_SELECTION)" --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check conveyor tests benchmarks examples
	$(VENV)/bin/ruff format --check conveyor tests benchmarks examples

bench: bytecode
	$(PY) benchmarks/unbalanced3.py --mode sleep
	$(PY) benchmarks/unbalanced3.py --mode cpu
	$(PY) benchmarks/tiny3.py
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/policy_scale.py --in-situ
	$(PY) benchmarks/sim_hour.py --quiet

# The video pipeline: 8 generated 60 s 720p30 videos, sequential vs streaming vs batch (both
# kinds of work), memory from 4 to 16 videos, a 2-node loopback Ray cluster, and the
# simulator scenario of the measured costs (about an hour on 2 cores)
bench-video: bytecode
	$(PY) benchmarks/video.py --memory 4,16 --ray \
		--scenario-out conveyor/sim/scenarios/video_curation_measured.yaml

# `conveyor video` and a plain PyAV script (benchmarks/plain_video.py) as a user runs them:
# first clip on disk, CPU of the process tree, wall; fixed work on 4 videos of 60 s 720p30,
# 2,000 small videos, shots (ours only); three repeats, alternating
bench-video-user: bytecode
	$(PY) benchmarks/video.py --user --repeats 3

# Many small videos (issue 29): 2,000 and 20,000 generated 2 s videos through `conveyor video`
# (fixed split, no models): the driver's CPU per video and peak memory at both sizes and their
# ratio, the journal's size, the resume time with 95% done, the summary time (an hour and
# more on 2 cores; --quick: 200 and 2,000)
bench-video-many: bytecode
	$(PY) benchmarks/video_many.py --sizes 2000,20000

# Peers (Cosmos-Xenna; tqdm is a dependency it does not declare; datatrove for the text
# benchmark, with the fastText and xxhash builds it needs kept apart in .venv/peers) are installed here only,
# never by `make test`. On Python 3.11 pip picks cosmos-xenna 0.3.0 (0.4+ needs 3.12).
bench-peers: bytecode
	$(PY) -m pip install --quiet cosmos-xenna tqdm
	$(PY) benchmarks/peers.py
	$(PY) -m pip install --quiet datatrove fasteners orjson
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/peers fasttext-numpy2-wheel "xxhash<4"
	$(PY) benchmarks/text.py

# Shot splitting against PySceneDetect (issue 27): 35 generated videos, its CLI (one video at a
# time, split-video), its API's detectors and ours, side by side. split-video needs an ffmpeg:
# imageio-ffmpeg's static binary, installed here only (conveyor does not depend on it)
bench-shots: bytecode
	$(PY) -m pip install --quiet imageio-ffmpeg
	$(PY) benchmarks/shots.py

# NeMo Curator 1.4.0 itself, side by side with conveyor.curator (benchmarks/curator.py --peer):
# installed apart, in .venv/peers-curator, never by `make test`, and put on the path of its
# benchmark process only. Its wheel and Cosmos-Xenna 0.2.0 without their declared dependencies
# (Ray, torch, pandas and pyarrow are the venv's; datasets, openai, hydra, jieba... are not
# on the path the benchmark uses), plus the small packages that path imports
CURATOR_PEERS := $(VENV)/peers-curator
$(CURATOR_PEERS)/.installed: $(STAMP)
	rm -rf $(CURATOR_PEERS)
	$(PY) -m pip install --quiet --no-deps --target $(CURATOR_PEERS) nemo-curator==1.4.0 \
		cosmos-xenna==0.2.0 loguru==0.7.3 obstore==0.12.1 tabulate==0.10.0 portpicker==1.6.0
	touch $@

bench-curator: $(CURATOR_PEERS)/.installed bytecode
	$(PY) benchmarks/curator.py --peer --files 80 --rows 8000 --repeats 2

# Semantic dedup on 1M and 5M synthetic 1,280-d embeddings against one process holding them
# all, recall against all pairs on 200,000, and 1M on a 2-node loopback Ray cluster (about
# 30 GB of disk under /tmp for the data, as much again while it runs; about an hour)
bench-semdedup: bytecode
	$(PY) benchmarks/semdedup.py --ray --json docs/data/semdedup_$$(date +%F).json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
