"""Array kernels behind ``conveyor.stages.text.dedup``: shingling, MinHash, LSH band keys,
candidate pairs, set Jaccard on many pairs at once, and a union-find over numpy arrays.

Everything works on whole batches with numpy so that the per-document Python cost is the text
normalisation and nothing else. All hashes are deterministic (xxh3 and fixed mixing constants),
so the same text gives the same keys in every worker, run and machine with the same ``rensa``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from itertools import chain

import numpy as np
import numpy.typing as npt

from conveyor.stages.text._scripts import UNSPACED_CHAR, UNSPACED_WORDS

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


class _Separators(dict[int, str]):
    """``str.translate`` table of ``normalised_words``: punctuation, symbols, controls and
    ``_`` become spaces; letters, digits, whitespace and combining marks stay; invisible
    format characters (a zero-width space, a soft hyphen) go, so that the word they sit in
    stays one word. Marks are letters' parts in Devanagari, Thai, Tamil...: taken for
    punctuation (as regular expressions' ``\\w`` takes them), "the boy plays" and "the girl
    plays" in Hindi became the same words. Filled as each character is first seen."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        category = unicodedata.category(char)
        kept = char.isalnum() or char.isspace() or category[0] == "M"
        value = "" if category == "Cf" else char if kept and char != "_" else " "
        self[code] = value
        return value


class _Invisible(dict[int, str]):
    """``str.translate`` table of ``exact_form``: invisible format characters go, the rest
    stays. Filled as each character is first seen."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        value = "" if unicodedata.category(char) == "Cf" else char
        self[code] = value
        return value


_SEPARATORS = _Separators()
_INVISIBLE = _Invisible()
#: ``normalise`` for ASCII text as one ``bytes.translate``: lower case, punctuation to spaces
_ASCII_TABLE = bytes(
    ord(c.lower()) if c.isalnum() else ord(c) if c.isspace() else ord(" ")
    for c in map(chr, range(256))
)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: coefficients of the positional polynomial that combines word hashes into a shingle hash
_SHINGLE_COEFFS = (
    0x9E3779B97F4A7C15,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0xD6E8FEB86659FD93,
    0xFF51AFD7ED558CCD,
    0xC4CEB9FE1A85EC53,
    0x27D4EB2F165667C5,
    0x85EBCA77C2B2AE63,
)


def normalise(text: str) -> str:
    """Unicode NFKC, lower case, punctuation and symbols (and ``_``) replaced by spaces,
    whitespace runs collapsed to one space, ends stripped.

    Replacing punctuation by a space rather than deleting it keeps ``end.Start`` two words;
    NFKC folds compatibility forms (full-width letters, ligatures) into their plain letters.
    """
    return " ".join(normalised_words(text))


def normalised_words(text: str) -> list[str]:
    """The words of ``normalise(text)`` (what shingles are made of); in a script written
    without spaces (Chinese, Japanese, Thai...) each character is a word, as the filters
    count them: split at spaces, a page of Chinese was a few clause-long "words", and a
    copy with one character changed shared none of its shingles."""
    if text.isascii():  # the same result, several times faster (NFKC keeps ASCII as it is)
        return text.encode("ascii").translate(_ASCII_TABLE).decode("ascii").split()
    plain = unicodedata.normalize("NFKC", text).lower().translate(_SEPARATORS)
    if UNSPACED_CHAR.search(plain) is None:
        return plain.split()
    return UNSPACED_WORDS.findall(plain)


def exact_form(text: str) -> str:
    """What exact dedup compares: Unicode NFKC, lower case, invisible format characters
    removed, whitespace runs collapsed to one space, ends stripped. Punctuation and symbols
    count: ``a < b`` is not ``a > b``, nor ``2 + 3`` ``2 - 3``, nor a price in dollars one in
    euros (with them replaced by spaces, as fuzzy dedup's words have them, each pair was
    one document)."""
    if text.isascii():
        return " ".join(text.lower().split())
    return " ".join(unicodedata.normalize("NFKC", text).lower().translate(_INVISIBLE).split())


def content_hash(text: str) -> int:
    """xxh3-64 of the UTF-8 of ``exact_form(text)``, as a signed int64 (fits an Arrow
    int64): exact dedup's key."""
    import xxhash

    value = xxhash.xxh3_64_intdigest(exact_form(text).encode("utf-8"))
    return value - (1 << 64) if value >= 1 << 63 else value


def sorted_unique(values: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    """``np.unique`` by sorting (numpy 2's hash-based unique is several times slower here)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def splitmix64(x: U64) -> U64:
    """The SplitMix64 finaliser, elementwise: a cheap bijective scrambler of 64-bit values."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def partition_of(values: I64 | U64, partitions: int) -> I64:
    """The hash partition of already well-mixed 64-bit keys."""
    return (values.view(np.uint64) % np.uint64(partitions)).astype(np.int64)


def doc_partition(doc_ids: I64, partitions: int) -> I64:
    """The partition of document ids (ids are sequential, so they are scrambled first)."""
    return partition_of(splitmix64(doc_ids.astype(np.int64).view(np.uint64)), partitions)


#: characters of text whose words ``shingle_hashes`` holds as Python strings at once (a
#: 16 MB batch of documents at once took 380 MB above the batch, which a worker's allocator
#: kept); signatures likewise come from ``rensa`` in runs of ``_SIGNATURE_DOCS`` documents
_SHINGLE_CHARS = 1 << 20
_SIGNATURE_DOCS = 2048


def shingle_hashes(texts: Sequence[str], shingle_size: int) -> tuple[U64, I64]:
    """64-bit hashes of each text's word ``shingle_size``-grams after ``normalise``.

    Returns ``(flat, offsets)``: document ``i``'s hashes are ``flat[offsets[i]:offsets[i+1]]``
    (not deduplicated). A text with fewer words than ``shingle_size`` has one shingle, all its
    words; a text with no words has none. Made in runs of about ``_SHINGLE_CHARS``
    characters of text.
    """
    runs, start, size = [], 0, 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= _SHINGLE_CHARS:
            runs.append(_shingle_hashes(texts[start : i + 1], shingle_size))
            start, size = i + 1, 0
    if start < len(texts) or not runs:
        runs.append(_shingle_hashes(texts[start:], shingle_size))
    if len(runs) == 1:
        return runs[0]
    flat = np.concatenate([run[0] for run in runs])
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    at, base = 1, 0
    for _, run_offsets in runs:
        offsets[at : at + len(run_offsets) - 1] = run_offsets[1:] + base
        at += len(run_offsets) - 1
        base += int(run_offsets[-1])
    return flat, offsets


def _shingle_hashes(texts: Sequence[str], shingle_size: int) -> tuple[U64, I64]:
    import pyarrow as pa
    import xxhash

    word_lists = [normalised_words(text) for text in texts]
    counts = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(word_lists))
    shingles = np.where(counts >= shingle_size, counts - shingle_size + 1, np.minimum(counts, 1))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(shingles, out=offsets[1:])
    total_words = int(counts.sum())
    if total_words == 0:
        return np.zeros(0, dtype=np.uint64), offsets
    # hash each distinct word once: a batch repeats its vocabulary many times over
    encoded = pa.array(chain.from_iterable(word_lists), type=pa.large_string()).dictionary_encode()
    vocabulary = encoded.dictionary.to_pylist()
    vocab_hashes = np.fromiter(
        (xxhash.xxh3_64_intdigest(word.encode("utf-8")) for word in vocabulary),
        dtype=np.uint64,
        count=len(vocabulary),
    )
    words = vocab_hashes[encoded.indices.to_numpy(zero_copy_only=False)]
    coeffs = [np.uint64(_SHINGLE_COEFFS[j % len(_SHINGLE_COEFFS)] + 2 * j) for j in range(64)]
    starts = np.zeros(len(texts), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    out = np.zeros(int(offsets[-1]), dtype=np.uint64)
    with np.errstate(over="ignore"):
        full = counts >= shingle_size
        if total_words >= shingle_size and full.any():
            windows = total_words - shingle_size + 1
            rolling = np.zeros(windows, dtype=np.uint64)
            for j in range(shingle_size):
                rolling += words[j : j + windows] * coeffs[j % 64]
            # document d's windows start at starts[d] .. starts[d] + shingles[d] - 1
            n = shingles[full]
            within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
            target = np.repeat(offsets[:-1][full], n) + within
            out[target] = rolling[np.repeat(starts[full], n) + within]
        for d in np.flatnonzero((counts > 0) & ~full):
            value = np.uint64(0)
            for j in range(int(counts[d])):
                value += words[starts[d] + j] * coeffs[j % 64]
            out[offsets[d]] = value
    return splitmix64(out), offsets


def signatures(flat: U64, offsets: I64, num_perm: int, seed: int) -> npt.NDArray[np.uint32]:
    """MinHash signatures (rensa's R-MinHash), one row of ``num_perm`` values per document."""
    import rensa

    documents = len(offsets) - 1
    out = np.zeros((max(documents, 0), num_perm), dtype=np.uint32)
    for lo in range(0, documents, _SIGNATURE_DOCS):  # its rows are Python lists of ints
        hi = min(lo + _SIGNATURE_DOCS, documents)
        first, last = int(offsets[lo]), int(offsets[hi])
        matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(
            np.ascontiguousarray(flat[first:last], dtype=np.uint64),
            (offsets[lo : hi + 1] - first).astype(np.uint64),
            num_perm,
            seed,
        )
        out[lo:hi] = np.asarray(matrix.to_rows(), dtype=np.uint32).reshape(hi - lo, num_perm)
    return out


def band_keys(sig: npt.NDArray[np.uint32], bands: int, rows: int) -> U64:
    """``(documents, bands)`` 64-bit keys: band ``b``'s key hashes its ``rows`` signature values
    together with ``b``, so equal keys mean equal bands of the same index."""
    n = sig.shape[0]
    parts = sig.reshape(n, bands, rows).astype(np.uint64)
    state = splitmix64(np.arange(1, bands + 1, dtype=np.uint64) * _GOLDEN)
    keys = np.broadcast_to(state, (n, bands)).copy()
    for j in range(rows):
        keys = splitmix64(keys ^ parts[:, :, j])
    return keys


def unique_sets(flat: U64, offsets: I64) -> tuple[npt.NDArray[np.uint32], I64]:
    """Each document's shingle hashes cut to 32 bits, sorted and deduplicated (the stored form
    for the exact Jaccard check: half the disk, and a 32-bit collision between two documents'
    few hundred shingles is a ~1e-5 effect on their Jaccard)."""
    lengths = np.diff(offsets)
    doc = np.repeat(np.arange(len(lengths), dtype=np.uint64), lengths)
    packed = sorted_unique((doc << np.uint64(32)) | (flat & np.uint64(0xFFFFFFFF)))
    values = (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    counts = np.bincount((packed >> np.uint64(32)).astype(np.int64), minlength=len(lengths))
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return values, out


def dedupe_rows(keys: I64, docs: I64) -> tuple[I64, I64]:
    """``(key, doc)`` rows sorted by key then doc, each distinct row once (a batch spilled twice
    under different names, or a retried batch, adds nothing)."""
    order = np.lexsort((docs, keys))
    keys, docs = keys[order], docs[order]
    if len(keys) > 1:
        keep = np.ones(len(keys), dtype=bool)
        keep[1:] = (keys[1:] != keys[:-1]) | (docs[1:] != docs[:-1])
        keys, docs = keys[keep], docs[keep]
    return keys, docs


def group_starts(keys: I64) -> npt.NDArray[np.bool_]:
    """For sorted ``keys``: whether each row starts a new group of equal keys."""
    starts = np.ones(len(keys), dtype=bool)
    starts[1:] = keys[1:] != keys[:-1]
    return starts


def bucket_pairs(keys: I64, docs: I64) -> tuple[I64, I64]:
    """Candidate pairs ``(a, b)``, ``a < b``, from rows sorted by ``dedupe_rows``.

    In every bucket (equal keys) with members ``m0 < m1 < ... < mk``, each member is paired with
    ``m0`` (the star) and with its predecessor (the chain): ``2k - 1`` pairs instead of the
    ``k(k+1)/2`` of all pairs, still connecting the bucket, and with the chain giving a member
    that is close to its neighbour but not to ``m0`` its own chance in the Jaccard check.
    """
    if len(keys) < 2:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    starts = group_starts(keys)
    group = np.cumsum(starts) - 1
    first = docs[starts][group]
    members = ~starts
    star_a, star_b = first[members], docs[members]
    follower = np.flatnonzero(members)
    follower = follower[follower - 1 >= 0]
    chain_mask = ~starts[follower - 1]  # the predecessor is not m0 (that pair is in the star)
    chain_a, chain_b = docs[follower - 1][chain_mask], docs[follower][chain_mask]
    return unique_pairs(np.concatenate([star_a, chain_a]), np.concatenate([star_b, chain_b]))


def unique_pairs(a: I64, b: I64) -> tuple[I64, I64]:
    """Distinct pairs, sorted by ``a`` then ``b``."""
    if len(a) == 0:
        return a.astype(np.int64), b.astype(np.int64)
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.ones(len(a), dtype=bool)
    keep[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[keep], b[keep]


def pair_jaccard(
    a_index: I64,
    b_index: I64,
    a_values: npt.NDArray[np.uint32],
    a_offsets: I64,
    b_values: npt.NDArray[np.uint32],
    b_offsets: I64,
    chunk_elements: int = 1_000_000,
) -> npt.NDArray[np.float64]:
    """Jaccard of set ``a_index[i]`` of the first table with set ``b_index[i]`` of the second.

    The sets are sorted and distinct (``unique_sets``). A chunk of pairs is done at once:
    every element is tagged with its pair number, the tagged elements of both sides are sorted
    together, and an element present on both sides shows up as two equal neighbours.
    """
    out = np.zeros(len(a_index), dtype=np.float64)
    a_len = np.diff(a_offsets)[a_index]
    b_len = np.diff(b_offsets)[b_index]
    sizes = a_len + b_len
    cumulative = np.cumsum(sizes)
    start = 0
    while start < len(a_index):
        done = int(cumulative[start - 1]) if start else 0
        stop = int(np.searchsorted(cumulative, done + chunk_elements, side="right"))
        stop = max(stop, start + 1)
        sl = slice(start, stop)
        tags_a = _gather(a_values, a_offsets, a_index[sl])
        tags_b = _gather(b_values, b_offsets, b_index[sl])
        merged = np.sort(np.concatenate([tags_a, tags_b]))
        same = merged[1:] == merged[:-1]
        inter = np.bincount(
            (merged[1:][same] >> np.uint64(32)).astype(np.int64), minlength=stop - start
        )
        union = sizes[sl] - inter
        out[sl] = np.divide(inter, union, out=np.zeros(stop - start), where=union > 0)
        start = stop
    return out


def _gather(values: npt.NDArray[np.uint32], offsets: I64, index: I64) -> U64:
    """The sets ``index`` of a (values, offsets) table, each element tagged with its position
    in ``index`` in the high 32 bits."""
    lengths = (offsets[1:] - offsets[:-1])[index]
    total = int(lengths.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    positions = np.repeat(offsets[:-1][index], lengths) + within
    tags = np.repeat(np.arange(len(index), dtype=np.uint64), lengths)
    return (tags << np.uint64(32)) | values[positions].astype(np.uint64)


def components(a: I64, b: I64) -> tuple[I64, I64]:
    """Connected components of the graph with edges ``(a[i], b[i])``.

    Returns ``(nodes, roots)``: the sorted distinct ids that appear in an edge and, for each,
    the smallest id of its component. Only those nodes are held, never every document. The
    union-find is vectorised: every round links each edge's larger root under the smaller one
    (``np.minimum.at`` settles several links to one root), then compresses all paths; a parent
    is never larger than its child, so the root of a component is its smallest id.
    """
    nodes = sorted_unique(np.concatenate([a, b]))
    if len(nodes) == 0:
        return nodes, nodes
    parent = np.arange(len(nodes), dtype=np.int64)
    ia = np.searchsorted(nodes, a)
    ib = np.searchsorted(nodes, b)
    while len(ia):
        ra, rb = parent[ia], parent[ib]  # parent is fully compressed: these are roots
        differ = ra != rb
        if not differ.any():
            break
        ia, ib, ra, rb = ia[differ], ib[differ], ra[differ], rb[differ]
        np.minimum.at(parent, np.maximum(ra, rb), np.minimum(ra, rb))
        while True:  # path compression: point every node at its root
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
    return nodes, nodes[parent]
