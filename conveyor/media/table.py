"""The clip table: every clip's meta as one Parquet row, ``metadata/<video_id>.parquet`` (or
``metadata/group-<hash>.parquet``, shared by short videos written together).

Millions of clips make millions of ``metas/<clip_id>.json`` files, which a file system lists
slowly and a query engine reads one by one. The table holds the same fields, a file per
video (or per batch of short ones), under one schema for every video of every run, so that
``pyarrow.dataset.dataset("OUT/metadata")``, DuckDB (``read_parquet('OUT/metadata/*.parquet')``)
or Polars (``scan_parquet``) read the whole output as one table:

- scalars stay columns of their own; ``span`` and ``frame_span`` become ``start_s``/``end_s``
  and ``start_frame``/``end_frame``, the source's fields ``source_width`` ... ``source_codec``;
- each score is a column ``score_<name>`` (``SCORE_NAMES``, null where the clip has none),
  so a filter is a plain comparison (``WHERE score_aesthetic > 4``) that Parquet's
  statistics can skip row groups for;
- ``tags`` is ``list<struct<label, score>>``; ``errors`` and ``captions`` (keys vary) are
  ``map<string, string>``; the video type is ``video_type`` (its label) and
  ``video_type_scores`` (``map<string, double>``);
- ``kept`` (made, not filtered, not failed) and ``video_id`` are added for queries.

``clip_metas`` turns rows back into the very dicts ``metas/<clip_id>.json`` holds, so a
reader of metas can read the table instead.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

#: every score a filter sets (``Clip.scores``), each a column ``score_<name>``: a filter
#: with a new score adds its name here (the table refuses a score it has no column for)
SCORE_NAMES = (
    "aesthetic",
    "motion_global_mean",
    "motion_patch_min",
    "nsfw",
    "overlay_text",
    "overlay_text_mean",
    "quality_blank_fraction",
    "quality_brightness",
    "quality_dark_fraction",
    "quality_frozen_fraction",
    "quality_sharpness",
)


@functools.cache
def clip_schema() -> Any:
    """The table's pyarrow schema (the same for every video, whatever its clips hold)."""
    import pyarrow as pa

    text_map = pa.map_(pa.string(), pa.string())
    return pa.schema(
        [
            ("clip_id", pa.string()),
            ("video_id", pa.string()),
            ("source_video", pa.string()),
            ("kept", pa.bool_()),
            ("start_s", pa.float64()),
            ("end_s", pa.float64()),
            ("start_frame", pa.int64()),
            ("end_frame", pa.int64()),
            ("duration_s", pa.float64()),
            ("width", pa.int64()),
            ("height", pa.int64()),
            ("display_width", pa.int64()),
            ("display_height", pa.int64()),
            ("fps", pa.float64()),
            ("num_frames", pa.int64()),
            ("codec", pa.string()),
            ("num_bytes", pa.int64()),
            ("clip_location", pa.string()),
            *[(f"score_{name}", pa.float64()) for name in SCORE_NAMES],
            ("filtered_by", pa.string()),
            ("errors", text_map),
            ("tags", pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))),
            ("captions", text_map),
            ("video_type", pa.string()),
            ("video_type_scores", pa.map_(pa.string(), pa.float64())),
            ("has_embedding", pa.bool_()),
            ("duplicate_of", pa.string()),
            ("motion_source", pa.string()),
            ("source_width", pa.int64()),
            ("source_height", pa.int64()),
            ("source_fps", pa.float64()),
            ("source_codec", pa.string()),
        ]
    )


def clip_table(vid: str, metas: Sequence[dict[str, Any]]) -> Any:
    """The table of one video's (or chunk's) clips from their metas (``clip_meta``), in order.

    Raises ``ValueError`` for a score without a column: a filter whose score the table
    would drop silently is a bug to fix where it is made (``SCORE_NAMES``)."""
    return videos_table([(vid, metas)])


def videos_table(videos: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> Any:
    """One table of several videos' clips (``(video id, metas)`` each), in that order."""
    import pyarrow as pa

    rows = [_row(vid, meta) for vid, metas in videos for meta in metas]
    return pa.Table.from_pylist(rows, schema=clip_schema())


def _row(vid: str, meta: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(meta["scores"]) - set(SCORE_NAMES))
    if unknown:
        raise ValueError(
            f"clip {meta['clip_id']}: score(s) {', '.join(unknown)} have no column in the clip "
            "table: add them to conveyor.media.table.SCORE_NAMES"
        )
    video_type = meta.get("video_type")
    source = meta.get("source") or {}
    row = {
        "clip_id": meta["clip_id"],
        "video_id": vid,
        "source_video": meta["source_video"],
        "kept": meta["filtered_by"] is None and not meta["errors"],
        "start_s": meta["span"][0],
        "end_s": meta["span"][1],
        "start_frame": meta["frame_span"][0],
        "end_frame": meta["frame_span"][1],
        **{k: meta[k] for k in _SCALARS},
        "filtered_by": meta["filtered_by"],
        "errors": list(meta["errors"].items()),
        "tags": meta["tags"],
        "captions": list(meta["captions"].items()),
        "video_type": video_type["label"] if video_type else None,
        "video_type_scores": list(video_type["scores"].items()) if video_type else None,
        "has_embedding": meta["has_embedding"],
        "duplicate_of": meta["duplicate_of"],
        "motion_source": meta["motion_source"],
        **{f"source_{k}": source.get(k) for k in _SOURCE},
    }
    for name, value in meta["scores"].items():
        row[f"score_{name}"] = value
    return row


#: meta fields that are columns of the same name
_SCALARS = (
    "duration_s", "width", "height", "display_width", "display_height", "fps", "num_frames",
    "codec", "num_bytes", "clip_location",
)  # fmt: skip
#: the meta's ``source`` fields, columns ``source_<name>``
_SOURCE = ("width", "height", "fps", "codec")


def clip_metas(table: Any) -> list[dict[str, Any]]:
    """The table's rows as the metas they were made from (``metas/<clip_id>.json``)."""
    metas = []
    for row in table.to_pylist():
        video_type = None
        if row["video_type"] is not None:
            video_type = {"label": row["video_type"], "scores": dict(row["video_type_scores"])}
        scores = {
            name: row[f"score_{name}"]
            for name in SCORE_NAMES
            if row.get(f"score_{name}") is not None
        }
        metas.append(
            {
                "clip_id": row["clip_id"],
                "source_video": row["source_video"],
                "span": [row["start_s"], row["end_s"]],
                "frame_span": [row["start_frame"], row["end_frame"]],
                **{k: row.get(k) for k in _SCALARS},  # older tables lack the display size
                "scores": scores,
                "filtered_by": row["filtered_by"],
                "errors": dict(row["errors"]),
                "tags": row["tags"],
                "captions": dict(row["captions"]),
                "video_type": video_type,
                "has_embedding": row["has_embedding"],
                "duplicate_of": row["duplicate_of"],
                "motion_source": row["motion_source"],
                "source": {k: row[f"source_{k}"] for k in _SOURCE},
            }
        )
    return metas
