"""Exact and perceptual duplicates in input order, and packing staged parts into shards:
in order, duplicates left out, each image in one shard however the packing was cut short."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conveyor.media.tar_shards import OPEN_STATE
from conveyor.stages.image import shards as shards_module
from conveyor.stages.image.dedup import exact_duplicates, keep_packed, phash_duplicates
from conveyor.stages.image.layout import ImageLayout
from conveyor.stages.image.shards import pack_shards
from conveyor.stages.image.writer import sample_members, tar_bytes
from conveyor.tasks.image import ImageRecord


def test_exact_duplicates_point_at_the_first_copy() -> None:
    marks = exact_duplicates(["a", "b", "c", "d", "e"], ["h1", "h2", "h1", "h1", "h2"])
    assert marks == {"c": ("a", 0.0), "d": ("a", 0.0), "e": ("b", 0.0)}


def test_an_image_a_shard_holds_is_never_marked() -> None:
    marks = {"p1": ("n1", 1.0), "p2": ("n1", 2.0), "p3": ("p4", 3.0), "n2": ("p1", 4.0)}
    kept, unmarked = keep_packed(marks, {"p1", "p2", "p3", "p4"})
    # p1's copy gives way to it; p2's is marked already; p3 and p4 both shipped: both stay
    assert kept == {"n1": ("p1", 1.0), "n2": ("p1", 4.0)}
    assert unmarked == 3
    assert keep_packed(marks, set()) == (marks, 0)


def brute_force(hashes: np.ndarray, most: int) -> dict[int, tuple[int, int]]:
    found = {}
    for j in range(len(hashes)):
        near = [
            (int(np.bitwise_count(hashes[i] ^ hashes[j])), i)
            for i in range(j)
            if np.bitwise_count(hashes[i] ^ hashes[j]) <= most
        ]
        if near:
            distance, i = min(near)
            found[j] = (i, distance)
    return found


@pytest.mark.parametrize("most", [0, 3, 6])
def test_phash_duplicates_find_every_pair_brute_force_finds(most: int) -> None:
    rng = np.random.default_rng(most)
    bases = rng.integers(0, 2**63, 40, dtype=np.uint64)
    hashes = [*bases]
    for _ in range(120):  # copies with a few bits flipped
        flipped = rng.choice(bases)
        for bit in rng.choice(64, size=rng.integers(0, 8), replace=False):
            flipped ^= np.uint64(1 << int(bit))
        hashes.append(flipped)
    hashes = np.asarray(rng.permutation(hashes), dtype=np.uint64)
    ids = [f"i{k}" for k in range(len(hashes))]
    marks = phash_duplicates(ids, hashes, most)
    expected = brute_force(hashes, most)
    assert marks == {ids[j]: (ids[i], float(d)) for j, (i, d) in expected.items()}
    assert expected or most == 0


def staged_part(layout: ImageLayout, index: int, count: int, size: int = 3000) -> list[str]:
    """A part's staged tar of ``count`` samples of about ``size`` bytes each; their ids."""
    samples, ids = [], []
    for k in range(count):
        image = ImageRecord(f"p{index}/{k}", "s", k, payload=bytes([k]) * size, payload_ext="jpg")
        samples.append(sample_members(image, {"id": image.id}))
        ids.append(image.id)
    layout.write_bytes(layout.staged_samples(index), tar_bytes(samples))
    return ids


def shard_ids(layout: ImageLayout) -> list[str]:
    found = []
    for tar in sorted((layout.local / "shards").glob("*.tar")):
        with tarfile.open(tar) as shard:
            found += [m.name.split(".")[0] for m in shard if m.name.endswith(".json")]
    return found


def test_parts_are_packed_in_order_without_duplicates_and_their_staging_removed(
    tmp_path: Path,
) -> None:
    layout = ImageLayout(tmp_path)
    ids = [staged_part(layout, index, 4) for index in range(3)]
    duplicates = {ids[1][0], ids[2][3]}
    result = pack_shards(layout, 0.02, [(i, f"d{i}") for i in range(3)], duplicates)
    expected = [i for part in ids for i in part if i not in duplicates]
    assert shard_ids(layout) == expected
    assert result.samples == result.added == 10 and result.shards >= 2
    assert not list(layout.part_staging.glob("*.tar"))
    again = pack_shards(layout, 0.02, [(i, f"d{i}") for i in range(3)], duplicates)
    assert again.added == 0 and shard_ids(layout) == expected


def test_packing_cut_short_takes_up_where_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = ImageLayout(tmp_path)
    ids = [staged_part(layout, index, 5) for index in range(4)]
    parts = [(i, f"d{i}") for i in range(4)]
    real = shards_module.staged_samples

    def killed(path: Path):  # type: ignore[no-untyped-def]
        if path.name == "part-000003.tar":
            raise OSError("killed while packing")
        return real(path)

    monkeypatch.setattr(shards_module, "staged_samples", killed)
    with pytest.raises(OSError, match="killed"):
        pack_shards(layout, 0.025, parts)
    work = layout.local / ".conveyor" / "shards"
    state = json.loads((work / OPEN_STATE).read_text())
    with open(work / f"shard-{state['shard']:06d}.tar", "ab") as tar:
        tar.write(b"half a sample")  # what the kill left after the last whole sample
    closed = {p.name: p.read_bytes() for p in (layout.local / "shards").iterdir()}
    assert closed and layout.staged_samples(0).exists()  # removed only once all are packed
    monkeypatch.undo()
    result = pack_shards(layout, 0.025, parts)
    assert shard_ids(layout) == [i for part in ids for i in part]
    assert result.samples == 20
    for name, data in closed.items():  # closed shards are never touched again
        assert (layout.local / "shards" / name).read_bytes() == data


def test_a_part_with_nothing_to_pack_stays_packed_for_the_next_run(tmp_path: Path) -> None:
    """Packed alone (images added to a finished output, all duplicates or failures), its
    completion went with the empty shard, its staging was removed, and every later run
    stopped: "part 1's kept images are not staged; run again with --overwrite"."""
    layout = ImageLayout(tmp_path)
    first = staged_part(layout, 0, 2)
    pack_shards(layout, 1.0, [(0, "d0")])
    (copy,) = staged_part(layout, 1, 1)  # a copy of an image already packed
    result = pack_shards(layout, 1.0, [(0, "d0"), (1, "d1")], duplicates={copy})
    assert result.added == 0 and not layout.staged_samples(1).exists()
    again = pack_shards(layout, 1.0, [(0, "d0"), (1, "d1")], duplicates={copy})
    assert again.added == 0 and shard_ids(layout) == first
    # the next part with samples goes on in the shard that part opened, and closes it
    staged_part(layout, 2, 2)
    parts = [(0, "d0"), (1, "d1"), (2, "d2")]
    assert pack_shards(layout, 1.0, parts, duplicates={copy}).added == 2
    assert (
        len(shard_ids(layout)) == 4 and not (layout.local / ".conveyor/shards/open.json").exists()
    )


def test_a_part_whose_input_changed_after_packing_is_refused(tmp_path: Path) -> None:
    layout = ImageLayout(tmp_path)
    staged_part(layout, 0, 2)
    pack_shards(layout, 1.0, [(0, "old")])
    staged_part(layout, 0, 2)
    with pytest.raises(ValueError, match="changed since it was packed"):
        pack_shards(layout, 1.0, [(0, "new")])


def test_a_missing_staged_part_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="part 3's kept images are not staged"):
        pack_shards(ImageLayout(tmp_path), 1.0, [(3, "d")])


def test_an_output_url_is_refused() -> None:
    with pytest.raises(ValueError, match="is a URL"):
        ImageLayout("s3://bucket/out")
