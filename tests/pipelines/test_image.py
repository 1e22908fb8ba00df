"""The image pipeline end to end on the local backend: a folder of every kind of image with
bad files, low-quality ones and planted exact, near and semantic duplicates, beside
img2dataset shards; the output's shards read back with ``webdataset``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from PIL import Image

from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.pipelines.image import (
    ConfigMismatch,
    ImageConfig,
    build_image_pipeline,
    check_resume,
    clear_output,
    run_image,
)
from conveyor.samples.image import encode, render_image, write_shards
from tests.stages.image.kinds import BAD, brightness_scorer, write_kinds


def local() -> StreamingExecutor:
    return StreamingExecutor(LocalBackend(num_cpus=2))


def make_inputs(root: Path) -> Path:
    """Every kind, bad files, low quality, and duplicates of ``photo.jpg`` planted after it:
    its bytes again, resized and recompressed (near), mirrored (semantic)."""
    folder = root / "in"
    written = write_kinds(folder)
    photo = np.asarray(Image.open(io.BytesIO(written["photo.jpg"])).convert("RGB"))
    (folder / "z-copy.jpg").write_bytes(written["photo.jpg"])
    smaller = Image.fromarray(photo).resize((150, 112))
    (folder / "z-near.jpg").write_bytes(encode(np.asarray(smaller), quality=60))
    (folder / "z-mirror.png").write_bytes(encode(np.ascontiguousarray(photo[:, ::-1]), "PNG"))
    low = folder / "low"
    low.mkdir()
    (low / "tiny.png").write_bytes(encode(render_image(20, 40, 30), "PNG"))
    (low / "blank.png").write_bytes(encode(np.full((100, 100, 3), 90, np.uint8), "PNG"))
    (low / "banner.png").write_bytes(encode(render_image(21, 600, 100), "PNG"))
    write_shards(folder / "shards", 5, 3, seed=40, sizes=[(160, 120)])
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("images"))


def metadata(output: Path) -> dict[str, dict[str, Any]]:
    table = ds.dataset(output / "metadata", format="parquet").to_table()
    rows = table.to_pylist()
    assert len(rows) == len({r["key"] for r in rows})  # a row per input image, once
    return {r["key"]: r for r in rows}


def shard_samples(output: Path) -> list[dict[str, Any]]:
    import webdataset as wds

    urls = sorted(str(p) for p in (output / "shards").glob("*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def config(inputs: Path, output: Path, **changes: Any) -> ImageConfig:
    values: dict[str, Any] = {"images_per_task": 6, "shard_mb": 0.05}
    values.update(changes)
    return ImageConfig(str(inputs), str(output), **values)


def test_a_run_keeps_what_is_good_lists_what_is_bad_and_packs_shards(
    inputs: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    report = run_image(config(inputs, output), local())
    assert report.result.completed and not report.result.failures
    rows = metadata(output)
    assert len(rows) == 11 + 5 + 3 + 3 + 5  # kinds, bad, duplicates, low quality, shards
    failed = {k: r["error"] for k, r in rows.items() if r["filtered_by"] == "error"}
    assert {k: v.split(":")[0] for k, v in failed.items()} == {
        f"bad/{name}": reason for name, (_, reason) in BAD.items()
    }
    filtered = {
        k: r["filtered_by"] for k, r in rows.items() if r["filtered_by"] not in (None, "error")
    }
    assert filtered == {
        "low/tiny.png": "too_small",
        "low/blank.png": "blank",
        "low/banner.png": "aspect_ratio",
    }
    photo = rows["photo.jpg"]
    assert rows["z-copy.jpg"]["duplicate_of"] == photo["id"]
    assert rows["z-near.jpg"]["duplicate_of"] is None  # exact dedup: other bytes
    assert rows["rotated.jpg"]["normalised"][0] == "exif-rotated"
    assert rows["shards/00000.tar/000000001"]["caption"] == "shapes on a gradient 1"
    assert json.loads(rows["shards/00000.tar/000000001"]["input_meta"])["status"] == "success"
    assert all(
        r["nsfw"] is not None and r["tags"] for r in rows.values() if r["filtered_by"] is None
    )
    kept = [r for r in rows.values() if r["filtered_by"] is None and r["duplicate_of"] is None]
    samples = shard_samples(output)
    assert [s["__key__"] for s in samples] == [
        r["id"] for r in sorted(kept, key=lambda r: r["order"])
    ]
    assert len(list((output / "shards").glob("*.tar"))) >= 2
    vectors = {
        r["id"]: r["embedding"]
        for p in (output / "embeddings").glob("*.parquet")
        for r in pq.read_table(p).to_pylist()
    }
    for sample in samples:
        meta = json.loads(sample["json"])
        assert meta == {**rows[meta["key"]], "duplicate_of": None}
        ext = meta["image_ext"]
        with Image.open(io.BytesIO(sample[ext])) as stored:
            assert stored.size == (meta["width"], meta["height"]) and stored.mode in ("RGB", "L")
        np.testing.assert_array_equal(
            np.load(io.BytesIO(sample["npy"])), np.asarray(vectors[meta["id"]], np.float32)
        )
    summary = json.loads((output / "summary.json").read_text())
    images = summary["images"]
    assert (images["in"], images["failed"], images["duplicates"]) == (27, 5, 1)
    assert images["in_shards"] == len(samples) == images["kept"] - 1
    assert images["filtered"] == {"aspect_ratio": 1, "blank": 1, "too_small": 1}
    assert {f["key"] for f in summary["failures"]} == set(failed)
    assert not list((output / ".conveyor" / "staging").glob("*.tar"))

    shards_before = {p.name: p.read_bytes() for p in (output / "shards").iterdir()}
    again = run_image(config(inputs, output), local())  # everything is complete: nothing redone
    assert again.summary["parts"]["done_this_run"] == 0
    assert again.summary["images"] == {**images}
    assert {p.name: p.read_bytes() for p in (output / "shards").iterdir()} == shards_before


def test_phash_finds_near_duplicates_and_score_only_filters_nothing(
    inputs: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    changes = {"dedup": "phash", "score_only": True, "embed": False, "tags": False, "nsfw": False}
    report = run_image(config(inputs, output, **changes), local())
    rows = metadata(output)
    photo = rows["photo.jpg"]["id"]
    assert rows["z-copy.jpg"]["duplicate_of"] == photo
    assert rows["z-near.jpg"]["duplicate_of"] == photo
    assert rows["z-mirror.png"]["duplicate_of"] is None  # mirrored: another perceptual hash
    assert report.summary["images"]["filtered"] == {}
    assert rows["low/blank.png"]["filtered_by"] is None and rows["low/blank.png"]["contrast"] == 0
    assert not list((output / "embeddings").glob("*.parquet"))
    assert report.summary["images"]["in_shards"] == 27 - 5 - 2
    table = pq.read_table(output / "duplicates.parquet")
    assert table.schema.field("distance").type == pa.int32()  # bits (it was a double)
    marks = {m["id"]: m for m in table.to_pylist()}
    assert marks[rows["z-copy.jpg"]["id"]]["distance"] == 0
    assert marks[rows["z-near.jpg"]["id"]]["distance"] <= 4


def test_semantic_dedup_finds_the_mirrored_copy_on_the_run_executor(
    inputs: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    changes = {"dedup": "semantic", "tags": False, "nsfw": False, "semantic_clusters": 1}
    report = run_image(config(inputs, output, **changes), local())
    rows = metadata(output)
    photo = rows["photo.jpg"]["id"]
    assert rows["z-copy.jpg"]["duplicate_of"] == photo
    assert rows["z-mirror.png"]["duplicate_of"] == photo
    assert (
        report.dedup is not None
        and report.dedup.duplicates == report.summary["images"]["duplicates"]
    )
    assert json.loads((output / "dedup.json").read_text())["mode"] == "semantic"
    in_shards = {s["__key__"] for s in shard_samples(output)}
    assert photo in in_shards and rows["z-mirror.png"]["id"] not in in_shards


def copies_of_one_photo(folder: Path) -> dict[str, str]:
    """A photo, and before and after it in input order a thumbnail, a darker copy, an
    enlarged copy and a brighter one (every one a few perceptual bits from the others):
    their names by what they are."""
    folder.mkdir()
    photo = Image.fromarray(render_image(3, 240, 180))
    copies = {
        "a-thumb.jpg": photo.resize((120, 90)),
        "b-dark.jpg": Image.eval(photo, lambda v: int(v * 0.6)),
        "photo.jpg": photo,
        "y-large.jpg": photo.resize((480, 360)),
        "z-bright.jpg": Image.eval(photo, lambda v: min(255, int(v * 1.2) + 20)),
    }
    for name, image in copies.items():
        (folder / name).write_bytes(encode(np.asarray(image), quality=90))
    return {name.split("-")[-1].split(".")[0]: name for name in copies}


# (semantic with the slow tests: the order it is given is the mechanism phash shows here)
@pytest.mark.parametrize(
    ("mode", "keep"),
    [("phash", "largest"), pytest.param("semantic", "aesthetic", marks=pytest.mark.slow)],
)
def test_dedup_keeps_the_largest_or_best_looking_copy_when_asked(
    tmp_path: Path, mode: str, keep: str
) -> None:
    """``first`` kept the thumbnail of a set whose thumbnail came first in the input."""
    names = copies_of_one_photo(tmp_path / "in")
    changes: dict[str, Any] = {"dedup": mode, "dedup_keep": keep, "nsfw": False, "tags": False}
    if mode == "phash":
        changes.update(embed=False)
    else:
        changes.update(semantic_threshold=0.8, semantic_clusters=1)
    if keep == "aesthetic":
        changes.update(aesthetic_model=brightness_scorer(tmp_path), aesthetic_threshold=0)
    made = config(tmp_path / "in", tmp_path / "out", **changes)
    report = run_image(made, local())
    rows = metadata(tmp_path / "out")
    kept = names["large" if keep == "largest" else "bright"]
    assert {k for k, r in rows.items() if r["duplicate_of"] is None} == {kept}
    assert all(rows[k]["duplicate_of"] for k in rows if k != kept)
    assert [s["__key__"] for s in shard_samples(tmp_path / "out")] == [rows[kept]["id"]]
    assert f"keeping the {keep}" in report.summary["pipeline"]
    assert json.loads((tmp_path / "out" / "dedup.json").read_text())["keep"] == keep
    # another rule on the same output would leave the shards packed by the first one's
    other = {**changes, "dedup_keep": "first"}
    with pytest.raises(ConfigMismatch, match=f"dedup_keep: '?{keep}'? -> '?first"):
        check_resume(config(tmp_path / "in", tmp_path / "out", **other))


# (semantic with the slow tests: the rule is the mode's, and phash shows it in seconds)
@pytest.mark.parametrize("mode", ["phash", pytest.param("semantic", marks=pytest.mark.slow)])
def test_an_image_packed_by_an_earlier_run_stays_kept_when_a_larger_copy_comes(
    tmp_path: Path, mode: str
) -> None:
    """More input, resumed: the larger copy came first in the keep order, and the photo a
    shard already held was marked its duplicate while both were in the shards."""
    folder = tmp_path / "in"
    folder.mkdir()
    photo = Image.fromarray(render_image(3, 240, 180))
    (folder / "a-photo.jpg").write_bytes(encode(np.asarray(photo), quality=90))
    (folder / "b-other.jpg").write_bytes(encode(render_image(7, 200, 150), quality=90))
    changes: dict[str, Any] = {"dedup": mode, "dedup_keep": "largest", "nsfw": False}
    if mode == "phash":
        changes.update(embed=False, tags=False)
    else:
        changes.update(tags=False, semantic_threshold=0.9, semantic_clusters=1)
    made = config(folder, tmp_path / "out", images_per_task=2, **changes)
    run_image(made, local())
    (folder / "z-large.jpg").write_bytes(encode(np.asarray(photo.resize((480, 360))), quality=90))
    report = run_image(made, local())
    rows = metadata(tmp_path / "out")
    photo_id, large_id = rows["a-photo.jpg"]["id"], rows["z-large.jpg"]["id"]
    assert rows["a-photo.jpg"]["duplicate_of"] is None
    assert rows["z-large.jpg"]["duplicate_of"] == photo_id
    in_shards = [s["__key__"] for s in shard_samples(tmp_path / "out")]
    assert sorted(in_shards) == sorted([photo_id, rows["b-other.jpg"]["id"]])
    assert large_id not in in_shards
    marks = pq.read_table(tmp_path / "out" / "duplicates.parquet").to_pylist()
    assert [(m["id"], m["duplicate_of"]) for m in marks] == [(large_id, photo_id)]
    assert json.loads((tmp_path / "out" / "dedup.json").read_text())["kept_in_shards"] == 1
    assert report.summary["images"]["duplicates"] == 1


def test_an_output_from_before_the_keep_rules_and_clip_score_resumes_without_them(
    tmp_path: Path,
) -> None:
    """An older output recorded no ``dedup_keep``: its shards were packed keeping the
    first; another rule is refused, and so is a filter its parts were kept without."""
    from tests.stages.video.conftest import save_whole_clip

    copies_of_one_photo(tmp_path / "in")
    output = tmp_path / "out"
    changes: dict[str, Any] = {"dedup": "phash", "embed": False, "nsfw": False, "tags": False}
    made = config(tmp_path / "in", output, **changes)
    run_image(made, local())
    recorded = json.loads((output / ".conveyor" / "config.json").read_text())
    for name in ("dedup_keep", "clip_score_model", "clip_score_threshold"):
        del recorded[name]
    (output / ".conveyor" / "config.json").write_text(json.dumps(recorded))
    assert check_resume(made) is not None
    with pytest.raises(ConfigMismatch, match="dedup_keep: 'first' -> 'largest'"):
        check_resume(config(tmp_path / "in", output, dedup_keep="largest", **changes))
    model = str(save_whole_clip(tmp_path / "clip"))
    with pytest.raises(ConfigMismatch, match="clip_score_model: None ->"):
        check_resume(config(tmp_path / "in", output, clip_score_model=model, **changes))


def test_embeddings_from_before_the_keep_rules_say_why_they_cannot_be_kept_by_one(
    tmp_path: Path,
) -> None:
    from conveyor.dedup.plan import SemanticDedupError
    from conveyor.stages.image.dedup import deduplicate
    from conveyor.stages.image.layout import ImageLayout

    layout = ImageLayout(tmp_path / "out")
    layout.part_embeddings(0).parent.mkdir(parents=True)
    vectors = pa.array([[1.0, 0.0], [1.0, 0.0]], pa.list_(pa.float32()))
    order = pa.array([0, 1], pa.int64())
    older = pa.table({"id": ["a", "b"], "order": order, "embedding": vectors})
    pq.write_table(older, layout.part_embeddings(0))
    with pytest.raises(SemanticDedupError, match="keeping the largest image reads them"):
        deduplicate(layout, [0], "semantic", keep="largest", clusters=1)


def test_the_clip_score_filter_runs_after_the_safety_filter_on_a_gpu_share(
    tmp_path: Path,
) -> None:
    from tests.stages.video.conftest import save_whole_clip

    model = str(save_whole_clip(tmp_path / "clip"))
    built = build_image_pipeline(
        config(tmp_path, tmp_path / "out", clip_score_model=model, gpus=True)
    )
    names = [s.name for s in built.stages]
    assert names.index("ImageClipScoreFilter") == names.index("ImageNSFWFilter") + 1
    (stage,) = [s for s in built.stages if s.name == "ImageClipScoreFilter"]
    assert stage.resources.gpus == 0.25 and stage.threshold == 0.28


@pytest.mark.slow
def test_the_clip_score_of_each_captioned_image_is_in_its_metadata(tmp_path: Path) -> None:
    """img2dataset's captions against their images, through a whole CLIP model; an image
    without a caption has none."""
    from tests.stages.video.conftest import save_whole_clip

    folder = tmp_path / "in"
    write_shards(folder / "shards", 4, 4, seed=40, sizes=[(160, 120)])
    (folder / "plain.png").write_bytes(encode(render_image(5, 160, 120), "PNG"))
    model = str(save_whole_clip(tmp_path / "clip"))
    changes = {"embed": False, "tags": False, "nsfw": False, "clip_score_threshold": -1}
    report = run_image(config(folder, tmp_path / "out", clip_score_model=model, **changes), local())
    rows = metadata(tmp_path / "out")
    assert [r["caption"] is not None for r in rows.values()].count(True) == 4
    assert all(-1 <= r["clip_score"] <= 1 for r in rows.values() if r["caption"])
    assert rows["plain.png"]["clip_score"] is None and rows["plain.png"]["filtered_by"] is None
    assert "CLIP score of the caption >= -1" in report.summary["pipeline"]
    metas = [json.loads(s["json"]) for s in shard_samples(tmp_path / "out")]
    assert sorted(m["clip_score"] is not None for m in metas) == [False, True, True, True, True]


def test_model_stages_share_a_gpu_where_there_is_one(tmp_path: Path) -> None:
    on_gpu = build_image_pipeline(config(tmp_path, tmp_path / "out", gpus=True))
    shares = {s.name: s.resources.gpus for s in on_gpu.stages}
    assert shares["ImageNSFWFilter"] == shares["ImageEmbedder"] == 0.25
    assert shares["ImageDecoder"] == 0
    on_cpu = build_image_pipeline(config(tmp_path, tmp_path / "out", gpus=False))
    assert all(s.resources.gpus == 0 for s in on_cpu.stages)


def test_tags_without_embeddings_come_from_the_tagger(inputs: Path, tmp_path: Path) -> None:
    changes = {"embed": False, "nsfw": False, "dedup": "none", "quality": False}
    pipeline = build_image_pipeline(config(inputs, tmp_path / "out", **changes))
    assert [s.name for s in pipeline.stages] == [
        "ImageReader",
        "ImageDecoder",
        "ImageTagger",
        "ImageWriter",
    ]
    assert "ImageNet tags" in pipeline.description and "dedup" not in pipeline.description


def test_resuming_with_other_options_is_refused_and_overwrite_clears(
    inputs: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    first = config(inputs, output, embed=False, tags=False, nsfw=False, limit=4)
    report = run_image(first, local())
    assert report.summary["images"]["in"] == 4
    with pytest.raises(ConfigMismatch, match="min_size: 64 -> 10"):
        check_resume(config(inputs, output, embed=False, tags=False, nsfw=False, min_size=10))
    # --limit decides what the last part holds: another one made that part again, its
    # metadata then no longer the shards', and its journal entry stuck every later run
    with pytest.raises(ConfigMismatch, match="limit: 4 -> None"):
        check_resume(config(inputs, output, embed=False, tags=False, nsfw=False))
    clear_output(output)
    assert not list(output.iterdir())


def four_images_in_two_parts(tmp_path: Path) -> tuple[Path, Path, ImageConfig]:
    """An input of 4 images, its output made in parts of 3, and the config that made it."""
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(4):
        (folder / f"{n}.png").write_bytes(encode(render_image(n, 120, 90), "PNG"))
    output = tmp_path / "out"
    made = config(folder, output, embed=False, tags=False, nsfw=False, images_per_task=3)
    assert run_image(made, local()).summary["images"]["kept"] == 4
    return folder, output, made


def test_a_packed_part_whose_images_changed_is_refused_before_it_is_done_again(
    tmp_path: Path,
) -> None:
    """The refusal came at packing, after the part's metadata and embeddings had been
    written again for the new image: the shards held the old one."""
    from conveyor.stages.image.sources import InputChanged

    folder, output, made = four_images_in_two_parts(tmp_path)
    before = {p.name: p.read_bytes() for p in (output / "metadata").iterdir()}
    summary = (output / "summary.json").read_bytes()
    (folder / "1.png").write_bytes(encode(render_image(9, 90, 120), "PNG"))
    with pytest.raises(InputChanged, match="part-000000 of the input changed since it was packed"):
        run_image(made, local())
    assert {p.name: p.read_bytes() for p in (output / "metadata").iterdir()} == before
    assert (output / "summary.json").read_bytes() == summary


def test_a_part_whose_record_or_metadata_was_deleted_is_done_again(tmp_path: Path) -> None:
    """The journal skipped it for ever: its metadata and embeddings were deleted, never
    written again, and every run said it would be tried again."""
    _, output, made = four_images_in_two_parts(tmp_path)
    rows, samples = metadata(output), shard_samples(output)
    (output / ".conveyor" / "parts" / "part-000000.json").unlink()
    again = run_image(made, local()).summary["images"]
    assert (again["kept"], again["incomplete"]) == (4, 0)
    assert metadata(output).keys() == rows.keys()
    assert sorted(map(str, shard_samples(output))) == sorted(map(str, samples))
    # its metadata file deleted: the same (it stopped every later run with a bare path)
    (output / "metadata" / "part-000001.parquet").unlink()
    again = run_image(made, local()).summary["images"]
    assert (again["kept"], again["incomplete"]) == (4, 0)
    assert metadata(output).keys() == rows.keys()
    assert sorted(map(str, shard_samples(output))) == sorted(map(str, samples))


def test_a_part_with_images_it_could_not_read_for_now_is_done_again(tmp_path: Path) -> None:
    """An image failed by a permission or I/O error stayed failed: its part was complete.
    Its record says so (``read_again``), and the next run reads the part again, packed
    the same."""
    _, output, made = four_images_in_two_parts(tmp_path)
    rows, samples = metadata(output), shard_samples(output)
    record_path = output / ".conveyor" / "parts" / "part-000000.json"
    record = json.loads(record_path.read_text())
    assert record["read_again"] == 0
    # as the writer leaves it when one of its images could not be read for now
    record_path.write_text(json.dumps({**record, "read_again": 1}))
    again = run_image(made, local()).summary
    assert again["parts"]["done_this_run"] == 1 and again["parts"]["skipped_as_complete"] == 1
    assert (again["images"]["kept"], again["images"]["read_again"]) == (4, 0)
    assert json.loads(record_path.read_text())["read_again"] == 0
    assert metadata(output).keys() == rows.keys()
    assert sorted(map(str, shard_samples(output))) == sorted(map(str, samples))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dedup": "semantic", "embed": False}, "compares embeddings"),
        ({"dedup": "fuzzy"}, "dedup must be one of"),
        ({"dedup_keep": "newest"}, "dedup_keep must be one of first, largest, aesthetic"),
        ({"dedup_keep": "largest"}, "needs dedup phash or semantic .copies of the same bytes"),
        ({"dedup": "none", "dedup_keep": "largest"}, "phash or semantic .no dedup runs"),
        ({"dedup": "phash", "dedup_keep": "aesthetic"}, "reads the aesthetic score"),
        ({"images_per_task": 0}, "images_per_task must be an int >= 1"),
        ({"phash_distance": 40}, "phash_distance must be at most 32"),
        ({"nsfw_threshold": 2.0}, "nsfw_threshold"),
        ({"shard_mb": 0}, "shard_mb"),
        ({"semantic_threshold": 0}, "semantic_threshold"),
        ({"aesthetic_model": "/no/such/model.pt"}, "aesthetic model path"),
        ({"clip_score_model": "/no/such/clip"}, "clip score model path"),
        ({"clip_score_threshold": 28}, r"clip_score_threshold must be a cosine in \[-1, 1\]"),
        ({"max_aspect": 0.5}, "max_aspect"),
        ({"limit": 0}, "limit"),
    ],
)
def test_bad_options_are_refused_with_the_reason(
    changes: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        config(tmp_path, tmp_path / "out", **changes)


def test_a_keep_rule_with_an_unknown_dedup_is_refused_for_the_dedup_alone(
    tmp_path: Path,
) -> None:
    """``dedup_keep`` is not said to need phash because no dedup runs: the dedup named is
    the mistake."""
    with pytest.raises(ValueError, match="dedup must be one of") as refused:
        config(tmp_path, tmp_path / "out", dedup="phahs", dedup_keep="largest")
    assert "dedup_keep" not in str(refused.value)


def test_an_output_url_or_the_input_itself_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a URL"):
        ImageConfig(str(tmp_path), "s3://bucket/out")
    with pytest.raises(ValueError, match="OUTPUT is the INPUT folder"):
        ImageConfig(str(tmp_path), str(tmp_path))


def test_a_part_the_engine_failed_is_incomplete_with_the_engines_reason(tmp_path: Path) -> None:
    from conveyor.engine.journal import key_label, source_key
    from conveyor.pipelines.image_summary import ImageTally, build_summary
    from conveyor.result import FailureRecord, RunResult
    from conveyor.samples.image import write_folder
    from conveyor.stages.image.sources import ImageSources

    write_folder(tmp_path / "in", 4, sizes=[(40, 30)])
    cfg = config(tmp_path / "in", tmp_path / "out", images_per_task=2)
    sources = ImageSources(cfg.input, cfg.output, images_per_task=2)
    parts = list(sources)
    label = key_label(source_key(parts[1])) + ".0"
    failure = FailureRecord("ImageDecoder", label, "MemoryError", "out of memory", "", 3)
    tally = ImageTally()
    tally.add_complete(
        parts[0],
        {
            "key": list(parts[0].key),
            "part": 0,
            "images": 2,
            "kept": 2,
            "filtered": {},
            "failures": [],
        },
    )
    result = RunResult(failures=[failure], completed=True)
    summary = build_summary(cfg, sources, tally, result, None, None, 1.0, build_image_pipeline(cfg))
    assert summary["parts"] == {
        "in": 2, "complete": 1, "incomplete": 1, "done_this_run": 0, "skipped_as_complete": 0,
    }  # fmt: skip
    assert summary["images"]["incomplete"] == 2 and summary["images"]["in"] == 4
    assert summary["failures"] == [
        {
            "part": 1,
            "key": "img-000002.jpg and 1 more",
            "stage": "ImageDecoder",
            "reason": "MemoryError: out of memory",
            "kind": "engine",
        }
    ]
