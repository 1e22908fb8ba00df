"""Writing clips, metadata and embeddings (the layout is in ``conveyor.media.layout``).

The writer takes chunks, and parts of chunks (``Video.part`` of ``Video.parts``: the
transcoder sends each clip on as it is encoded), in any order. For each it logs the clip ids
it is about to write (the intent), writes the clips (and, with ``meta_json``, their metas),
then its clip-table and embedding rows and its record, all in staging, named by chunk and
part. When every part of every chunk of a video is recorded, the video is finalised: its clip
table and embeddings are gathered into ``metadata/<video_id>.parquet`` and
``embeddings/<video_id>.parquet`` in clip order, its record is written to
``videos/<relative path>.json`` (that file's existence is what "complete" means to the next
run; the task that completed the video carries it on as ``Video.record``) and its staging
is removed. What a chunk says once (transitions, errors, damaged
packets) rides on one of its parts, so adding the records up counts it once. Two workers
finishing a video's last parts at once both finalise it, writing identical files: harmless,
and no lock is needed. A video that arrives whole in one task (every short video) has
nothing to gather: its intent is the only file staged, and its record is written at once;
those without embeddings that come in one batch share one clip table (``ClipWriter``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from conveyor.media.layout import OutputLayout, is_group_table, resumed_clips, staged_part
from conveyor.media.table import SCORE_NAMES, clip_table, videos_table
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.video.text_embed import clip_text
from conveyor.storage import ObjectPath, StoragePath
from conveyor.tasks.video import ERROR_FILTER, Clip, Video, VideoTask

#: the reason recorded for a readable video that gave no clip
NO_CLIPS = "too short: the video, or each of its shots once cropped, is under --min-clip"


def clip_meta(clip: Clip, video: Video, location: str | None) -> dict[str, Any]:
    """The ``metas/<clip_id>.json`` record of a clip (a row of its video's clip table)."""
    meta = video.metadata
    shown = meta.shown_size(clip.width, clip.height) if meta else (clip.width, clip.height)
    return {
        "clip_id": clip.clip_id,
        "source_video": clip.source_video,
        "span": [round(clip.span[0], 6), round(clip.span[1], 6)],
        "frame_span": list(clip.frame_span),
        "duration_s": round(clip.duration_s, 6),
        "width": clip.width,
        "height": clip.height,
        # as a player shows it (a phone's portrait video is stored landscape and turned;
        # DVD pixels are widened): width and height above are the stored pixels
        "display_width": shown[0],
        "display_height": shown[1],
        "fps": round(clip.fps, 6),
        "num_frames": clip.num_frames,
        "codec": clip.codec,
        "num_bytes": len(clip.encoded) if clip.encoded is not None else 0,
        "clip_location": location,
        "scores": {k: _number(v) for k, v in sorted(clip.scores.items())},
        "filtered_by": clip.filtered_by,
        "errors": dict(clip.errors),
        "tags": [{"label": label, "score": score} for label, score in clip.tags],
        "captions": dict(clip.captions),
        "video_type": clip.video_type,
        "has_embedding": clip.embedding is not None,
        "duplicate_of": clip.duplicate_of,
        # whose motion vectors scored it: the source's, or the encoded clip's (a source
        # whose decoder exports none, or --motion-source clip)
        "motion_source": clip.motion.source if clip.motion and clip.motion.frames else None,
        "source": {
            "width": meta.width if meta else None,
            "height": meta.height if meta else None,
            "fps": round(meta.fps, 6) if meta else None,
            "codec": meta.codec if meta else None,
        },
    }


def _number(value: Any) -> Any:
    return round(float(value), 8) if isinstance(value, (int, float)) else value


def _embedding_table(clips: list[Clip], attribute: str, with_text: bool = False) -> Any:
    import numpy as np
    import pyarrow as pa

    rows = [c for c in clips if getattr(c, attribute) is not None]
    if not rows:
        return None
    vectors = np.stack([np.asarray(getattr(c, attribute), dtype=np.float32) for c in rows])
    dim = vectors.shape[1]
    values = pa.array(vectors.reshape(-1), type=pa.float32())
    columns: dict[str, Any] = {"clip_id": pa.array([c.clip_id for c in rows], type=pa.string())}
    # the semantic dedup's keep rule (the earliest clip of the earliest video is kept) reads
    # these, so that it never opens a meta
    columns["source_video"] = pa.array([c.source_video for c in rows], type=pa.string())
    columns["start_s"] = pa.array([float(c.span[0]) for c in rows], type=pa.float64())
    if with_text:
        columns["text"] = pa.array([clip_text(c) for c in rows], type=pa.string())
    else:  # and its other keep rules (``DEDUP_KEEP``) these: the clip's length and scores
        columns["duration_s"] = pa.array([c.duration_s for c in rows], type=pa.float64())
        for name in SCORE_NAMES:
            scores = [c.scores.get(name) for c in rows]
            columns[f"score_{name}"] = pa.array(scores, type=pa.float64())
    columns["embedding"] = pa.ListArray.from_arrays(
        pa.array(np.arange(0, len(rows) * dim + 1, dim, dtype=np.int32)), values
    )
    return pa.table(columns)


class ClipWriter(ProcessingStage[VideoTask, VideoTask]):
    """Write each chunk's (or part's) clips and records under ``output``; finalise complete
    videos.

    Kept clips go to ``clips/``, filtered ones to ``filtered_clips/`` only with
    ``write_filtered``; every clip made gets a row in its video's clip table and, with
    ``meta_json``, a ``metas/<clip_id>.json`` too. Returns the chunk without its bytes,
    frames and vectors, so what reaches the driver stays small.

    Videos that arrive whole and carry no embeddings (short videos) share one clip table per
    batch (``metadata/group-<hash>.parquet``, ``process_batch``): a Parquet file of one row
    costs more than everything else the writer does for a 2 s video, and millions of
    one-row files are slow to list and read. A batch takes what arrived within
    ``batch_wait_s``, so a video's record waits that long at most; its clips do not wait.
    """

    resources = Resources(cpus=0.25)
    batch_size = 32
    batch_wait_s = 0.5

    def __init__(
        self,
        output: str | os.PathLike[str] | ObjectPath,
        *,
        write_filtered: bool = False,
        meta_json: bool = True,
    ) -> None:
        self.output = str(output)
        self.write_filtered = write_filtered
        self.meta_json = meta_json
        self._layout: OutputLayout | None = None

    def _output(self) -> OutputLayout:
        if self._layout is None:
            self._layout = OutputLayout(self.output)
        return self._layout

    def process_batch(self, tasks: list[VideoTask]) -> list[VideoTask]:
        sharing = [t.data for t in tasks if _shares_table(t.data)]
        if len(sharing) < 2:
            return [self.process(task) for task in tasks]
        layout = self._output()
        table = layout.group_table_path([v.video_id for v in sharing])
        name = layout.table_name(table)
        written = [self._write_clips(video, layout, name) for video in sharing]
        rows = [(v.video_id, w.metas) for v, w in zip(sharing, written, strict=True) if w.metas]
        if rows:
            layout.write_parquet(table, videos_table(rows))
        for video, w in zip(sharing, written, strict=True):
            record = _chunk_record(video, w.made)
            video.record = _video_record(video, [record], False, name if w.metas else None)
            if w.metas:  # a member that loses its record is found by the count (reader.py)
                video.record["clip_table_videos"] = len(rows)
            layout.write_json(layout.video_record(video.relative_path), video.record)
        for video, w in zip(sharing, written, strict=True):
            layout.remove_staging(layout.staging_dir(video.video_id), [w.intent])
        shared = {id(v) for v in sharing}
        return [_stripped(t) if id(t.data) in shared else self.process(t) for t in tasks]

    def process(self, task: VideoTask) -> VideoTask:
        video = task.data
        layout = self._output()
        own = layout.table_name(layout.clip_table_path(video.video_id))
        # a try after a failure comes alone, here: an intent its failed try left names the
        # table that try may have written the video's rows to
        whole = _whole(video)
        earlier = _logged_table(_intent(layout, video)) if whole else None
        w = self._write_clips(video, layout, own)
        clips = clip_table(video.video_id, w.metas) if w.metas else None
        kept = [c for c in w.made if c.kept]
        table = _embedding_table(kept, "embedding")
        texts = _embedding_table(kept, "text_embedding", with_text=True)
        staging = layout.staging_dir(video.video_id)
        adopted = _adopted(video, staging)
        record = _chunk_record(video, w.made, adopted)
        if whole:
            # the whole video in one task (every short video): nothing to gather from staging
            video.record = self._finalise(video, layout, [record], clips, table, texts)
            layout.remove_staging(layout.staging_dir(video.video_id), [w.intent])
            if earlier is not None and earlier != own and is_group_table(earlier):
                # (after the record: a reader never misses the video's rows)
                layout.drop_from_group(earlier, video.video_id)
            return _stripped(task)
        part = _part_name(video)
        files: dict[str, list[str]] = {prefix: [] for prefix in STAGED_TABLES}
        for old in adopted.values():  # what the earlier run staged for the restored clips
            for prefix, names in _staged_files(old).items():
                files[prefix] += [n for n in names if n not in files[prefix]]
        for staged, prefix in zip((clips, table, texts), STAGED_TABLES, strict=True):
            if staged is not None:
                files[prefix].append(f"{prefix}-{part}.parquet")
                layout.write_parquet(staging / files[prefix][-1], staged)
        record["files"] = files
        layout.write_json(staging / f"chunk-{part}.json", record)
        video.record = self._finalise_if_complete(video, layout, staging)
        return _stripped(task)

    def _write_clips(self, video: Video, layout: OutputLayout, table: str) -> _Written:
        """Log the intent (clip ids, and the table their rows go to), then write the clips
        and their metas."""
        intent = _intent(layout, video)
        # the staging folder is made by the first write into it
        ids = [c.clip_id for c in video.clips]
        layout.write_json(intent, {"clip_ids": ids, "clip_table": table})
        made = [c for c in video.clips if c.encoded is not None]  # the writer needs bytes
        metas = []
        for clip in made:
            location = None
            if clip.kept:
                location = f"clips/{clip.clip_id}.mp4"
            elif self.write_filtered:
                location = f"filtered_clips/{clip.clip_id}.mp4"
            if location is not None:
                layout.write_bytes(layout.root / location, clip.encoded or b"")
            metas.append(clip_meta(clip, video, location))
            if self.meta_json:
                layout.write_json(layout.meta_path(clip.clip_id), metas[-1])
        return _Written(intent, made, metas)

    def _finalise_if_complete(
        self, video: Video, layout: OutputLayout, staging: StoragePath
    ) -> dict[str, Any] | None:
        """The video's record if this call finalised it (``None``: not complete yet, or
        being finalised by another worker)."""
        # this attempt's records (an earlier, interrupted one's are adopted through them)
        mine = [p for p in staging.glob("chunk-*.json") if _of_attempt(p.name, video)]
        try:
            records = [json.loads(p.read_bytes()) for p in sorted(mine)]
        except (FileNotFoundError, ValueError):
            return None  # another worker is finalising this video right now
        if not _complete(records):
            return None
        records.sort(key=lambda r: (r["chunk_index"], r["part"]))
        try:
            clips, embeddings, texts = (
                _concat(layout, staging, _gathered(records, prefix)) for prefix in STAGED_TABLES
            )
        except FileNotFoundError:
            return None  # finalised meanwhile by another worker
        if video.resume is not None:
            clips, embeddings, texts = _as_recorded(records, clips, embeddings, texts)
            # an earlier attempt's clips this one made no more (its shots came out otherwise)
            restored = {cid for r in records for cid in r.get("adopted", [])}
            layout.remove_clips(set(resumed_clips(video.resume)) - restored)
        record = self._finalise(video, layout, records, clips, embeddings, texts)
        layout.remove_tree(staging)
        return record

    @staticmethod
    def _finalise(
        video: Video,
        layout: OutputLayout,
        records: list[dict[str, Any]],
        clips: Any,
        embeddings: Any,
        texts: Any,
    ) -> dict[str, Any]:
        """Write a complete video's clip table and embeddings and, last, its record (which
        is returned)."""
        vid = video.video_id
        for table, path in (
            (clips, layout.clip_table_path(vid)),
            (embeddings, layout.embedding_path(vid)),
            (texts, layout.text_embedding_path(vid)),
        ):
            if table is not None and table.num_rows:
                layout.write_parquet(path, table)
            else:
                path.unlink(missing_ok=True)
        has_rows = clips is not None and clips.num_rows > 0
        own = layout.table_name(layout.clip_table_path(vid)) if has_rows else None
        has_embeddings = embeddings is not None and embeddings.num_rows > 0
        record = _video_record(video, records, has_embeddings, own)
        layout.write_json(layout.video_record(video.relative_path), record)
        return record


#: the tables staged per part, by file name prefix: the clip table's rows, embeddings, text
#: embeddings
STAGED_TABLES = ("clips", "embed", "text")


def _part_name(video: Video) -> str:
    name = f"{video.chunk_index:06d}-{video.part:06d}"
    return f"g{video.generation}-{name}" if video.generation else name


def _whole(video: Video) -> bool:
    """The whole video in this task, and nothing of it staged to adopt."""
    return video.whole and not video.generation


def _of_attempt(name: str, video: Video) -> bool:
    """Whether the staged file ``name`` was written by this attempt at the video."""
    staged = staged_part(name)
    return staged is not None and staged[1] == video.generation


def _adopted(video: Video, staging: StoragePath) -> dict[str, dict[str, Any]]:
    """Clip id -> the record of the part an interrupted attempt staged it in, for this
    task's restored clips."""
    restored = [c.clip_id for c in video.clips if c.restored]
    if not restored or video.resume is None:
        return {}
    index = resumed_clips(video.resume)
    records: dict[str, dict[str, Any]] = {}
    adopted = {}
    for cid in restored:
        key = index[cid]
        if key not in records:
            records[key] = json.loads((staging / f"chunk-{key}.json").read_bytes())
        adopted[cid] = records[key]
    return adopted


def _staged_files(record: dict[str, Any]) -> dict[str, list[str]]:
    """The staged tables a part's record names, by prefix."""
    files = record.get("files") or {}
    return {prefix: list(files.get(prefix, [])) for prefix in STAGED_TABLES}


def _gathered(records: list[dict[str, Any]], prefix: str) -> list[str]:
    """The staged files of ``prefix`` the records name, in their order, each once."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(_staged_files(record)[prefix]))
    return list(names)


def _as_recorded(records: list[dict[str, Any]], *tables: Any) -> list[Any]:
    """A resumed video's gathered tables with exactly the rows the records name, in their
    order: an adopted part may hold clips this attempt made otherwise (or named twice)."""
    made = [cid for r in records for cid in r["clips"]]
    kept = [cid for r in records for cid in r["kept"]]
    return [_rows(table, made if i == 0 else kept) for i, table in enumerate(tables)]


def _rows(table: Any, ids: list[str]) -> Any:
    """``table``'s rows for ``ids`` (those it has), in that order, each once."""
    if table is None:
        return None
    import pyarrow as pa

    where = {cid: i for i, cid in enumerate(table.column("clip_id").to_pylist())}
    rows = [where[cid] for cid in dict.fromkeys(ids) if cid in where]
    return table.take(pa.array(rows, type=pa.int64()))


def _intent(layout: OutputLayout, video: Video) -> StoragePath:
    return layout.staging_dir(video.video_id) / f"intent-{_part_name(video)}.json"


def _shares_table(video: Video) -> bool:
    """A video whose rows go to its batch's shared table: whole in this task, and without
    embeddings (those stay a table per video, which ``deduplicate`` rewrites)."""
    return _whole(video) and not any(
        c.embedding is not None or c.text_embedding is not None
        for c in video.clips
        if c.encoded is not None and c.kept
    )


def _logged_table(intent: StoragePath) -> str | None:
    """The table an intent names (``None``: no intent, or one from before tables were
    named)."""
    try:
        logged = json.loads(intent.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return logged.get("clip_table") if isinstance(logged, dict) else None


@dataclass(slots=True)
class _Written:
    """What ``ClipWriter._write_clips`` wrote for one task."""

    intent: StoragePath
    made: list[Clip]
    metas: list[dict[str, Any]]


def _complete(records: list[dict[str, Any]]) -> bool:
    """Whether the staged records hold every part of every chunk up to the last one."""
    last = [r["chunk_index"] for r in records if r["last"]]
    if not last:
        return False
    parts: dict[int, set[int]] = {}
    counts: dict[int, int] = {}
    for record in records:
        parts.setdefault(record["chunk_index"], set()).add(record["part"])
        counts[record["chunk_index"]] = record["parts"]
    if set(parts) != set(range(last[0] + 1)):
        return False
    return all(parts[i] == set(range(counts[i])) for i in parts)


def _concat(layout: OutputLayout, staging: StoragePath, names: list[str]) -> Any:
    import pyarrow as pa

    if not names:
        return None
    # parts an interrupted earlier run (of an older version) staged may lack newer columns
    tables = [layout.read_table(staging / name) for name in names]
    return pa.concat_tables(tables, promote_options="default")


def _chunk_record(
    video: Video, made: list[Clip], adopted: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The staged record of one part: its clips' outcomes (a restored clip's as the record
    ``adopted`` for it says), and what the part says once for its chunk."""
    adopted = adopted or {}
    made_ids = {c.clip_id for c in made}
    clips: list[str] = []
    kept: list[str] = []
    kept_seconds = 0.0
    filtered: dict[str, list[str]] = {}
    errors: list[dict[str, Any]] = []
    for clip in video.clips:
        cid = clip.clip_id
        old = adopted.get(cid)
        if old is not None:
            is_made, is_kept = cid in old["clips"], cid in old["kept"]
            rejected = next((n for n, ids in old["filtered"].items() if cid in ids), None)
            errors += [e for e in old["clip_errors"] if e["clip_id"] == cid]
        else:
            is_made, is_kept = cid in made_ids, cid in made_ids and clip.kept
            rejected = clip.filtered_by if clip.filtered_by != ERROR_FILTER else None
            errors += [
                {"clip_id": cid, "span": list(clip.span), "stage": stage, "reason": reason}
                for stage, reason in clip.errors.items()
            ]
        if is_made:
            clips.append(cid)
            if is_kept:
                kept.append(cid)
                kept_seconds += clip.duration_s
            elif rejected is not None:
                filtered.setdefault(rejected, []).append(cid)
    earlier = list({id(r): r for r in adopted.values()}.values())
    decoded = next((r for r in earlier if r.get("decoder")), None) if not made else None
    return {
        "chunk_index": video.chunk_index,
        "part": video.part,
        "parts": video.parts,
        "last": video.last_chunk,
        "source": {"size_bytes": video.source_size, "mtime": video.source_mtime},
        "clips": clips,
        "kept": kept,
        "kept_seconds": round(kept_seconds, 6),
        "filtered": filtered,
        "clip_errors": errors,
        "adopted": list(adopted),
        "adopted_seconds": round(sum(c.duration_s for c in video.clips if c.clip_id in adopted), 6),
        "video_errors": dict(video.errors),
        "transitions": [list(t) for t in video.transitions],
        "damaged_packets": video.damaged_packets
        + sum(r.get("damaged_packets", 0) for r in earlier),
        "decoder": decoded["decoder"] if decoded else video.decoder,
        "decoder_fallback": decoded.get("decoder_fallback") if decoded else video.decoder_fallback,
        "shot_decoders": list(video.shot_decoders),
        "shot_decoder_fallback": video.shot_decoder_fallback,
    }


def _first(chunks: list[dict[str, Any]], key: str) -> Any:
    """The first of the chunks' ``key`` that is set (chunk records of older runs may lack
    it)."""
    return next((c[key] for c in chunks if c.get(key)), None)


def _video_record(
    video: Video, chunks: list[dict[str, Any]], has_embeddings: bool, clip_table: str | None
) -> dict[str, Any]:
    chunks = sorted(chunks, key=lambda r: (r["chunk_index"], r["part"]))
    errors: dict[str, str] = {}
    filtered: dict[str, list[str]] = {}
    for chunk in chunks:
        errors.update(chunk["video_errors"])
        for name, ids in chunk["filtered"].items():
            filtered.setdefault(name, []).extend(ids)
    meta = video.metadata
    transitions = sorted(tuple(t) for c in chunks for t in c.get("transitions", []))
    fps = meta.fps if meta else 0.0
    made = [cid for c in chunks for cid in c["clips"]]
    return {
        "video_id": video.video_id,
        "source_video": video.relative_path,
        "path": video.path,
        "source": {"size_bytes": video.source_size, "mtime": video.source_mtime},
        "status": "failed" if errors else "ok",
        "errors": errors,
        "metadata": meta.as_dict() if meta else None,
        "num_chunks": len({c["chunk_index"] for c in chunks}),
        "clips": made,
        # why a readable video gave nothing: the splitter's length rules are all that can
        "no_clips": None if errors or made else NO_CLIPS,
        "kept": [cid for c in chunks for cid in c["kept"]],
        "kept_seconds": round(sum(c["kept_seconds"] for c in chunks), 6),
        "filtered": filtered,
        "clip_errors": [e for c in chunks for e in c["clip_errors"]],
        # clips an interrupted run had finished, adopted as they were, and their length
        "resumed_clips": sum(len(c.get("adopted", ())) for c in chunks),
        "resumed_seconds": round(sum(c.get("adopted_seconds", 0.0) for c in chunks), 6),
        # packets the decoder refused while the clips were cut: those clips lack frames
        # (a damaged stretch too large to decode fails its clips instead: clip_errors)
        "damaged_packets": sum(c.get("damaged_packets", 0) for c in chunks),
        # what decoded the clips (the GPU's NVDEC, or the CPU), and why the CPU did where
        # NVDEC was asked for and could not take the video
        "decoders": sorted({c["decoder"] for c in chunks if c.get("decoder")}),
        "decoder_fallback": _first(chunks, "decoder_fallback"),
        # the same for the shot detector's small frames (empty: no shot detection)
        "shot_decoders": sorted({d for c in chunks for d in c.get("shot_decoders", [])}),
        "shot_decoder_fallback": _first(chunks, "shot_decoder_fallback"),
        # shot boundaries the detector found: frames (inclusive; a hard cut before frame c is
        # [c, c - 1]) and the time of each boundary's middle
        "transitions": [list(t) for t in transitions],
        "boundaries_s": [round((a + b + 1) / 2 / fps, 4) for a, b in transitions] if fps else [],
        # the table holding its clips' rows: its own, or one shared with the videos written
        # with it (``metadata/group-<hash>.parquet``; None: it made no clip)
        "clip_table": clip_table,
        "embeddings": f"embeddings/{video.video_id}.parquet" if has_embeddings else None,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _stripped(task: VideoTask) -> VideoTask:
    for clip in task.data.clips:
        clip.encoded = None
        clip.drop_frames()
        clip.embedding = None
        clip.text_embedding = None
    return task
