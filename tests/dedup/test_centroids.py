"""The clusters items go to: centroids that coincide are one, and an item's cluster is a
function of its embedding alone (not of the rows it is searched with)."""

from __future__ import annotations

import numpy as np

from conveyor.dedup.passes import COINCIDE, distinct_centroids, nearest_centroid
from conveyor.dedup.similarity import normalise


def family(seed: int, dim: int = 128, clusters: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """(v, centroids): faiss's spherical k-means on copies of one unit vector ``v``. Every
    cluster but one comes back empty and is refilled with a copy of a full one's centroid
    1/1024 apart, so all the centroids coincide with ``v`` up to ~1e-5."""
    import faiss

    v = normalise(np.random.default_rng(seed).normal(size=(1, dim)).astype(np.float32))
    kmeans = faiss.Kmeans(dim, clusters, niter=20, seed=0, spherical=True)
    kmeans.train(np.repeat(v, 2000, axis=0))
    return v, normalise(kmeans.centroids)


def index(centroids: np.ndarray):
    import faiss

    flat = faiss.IndexFlatIP(centroids.shape[1])
    flat.add(centroids)
    return flat


def test_one_row_gets_one_cluster_whatever_rows_it_is_searched_with() -> None:
    """faiss scored a row differently by batch (its own kernel under 20 rows, BLAS blocks
    above) and so picked one or another of centroids that coincide: seeds 0, 2 and 3 gave
    the copies of ``v`` two clusters."""
    others = normalise(np.random.default_rng(9).normal(size=(3000, 128)).astype(np.float32))
    for seed in range(4):
        v, centroids = family(seed)
        flat = index(centroids)
        got = set()
        for rows in (1, 2, 19, 20, 21, 3000):
            got |= set(nearest_centroid(flat, centroids, np.repeat(v, rows, axis=0)).tolist())
            batch = others[:rows].copy()
            places = [0, rows // 2, rows - 1]
            batch[places] = v[0]
            got |= set(nearest_centroid(flat, centroids, batch)[places].tolist())
        assert len(got) == 1, (seed, got)


def test_the_nearest_centroid_is_the_nearest() -> None:
    rng = np.random.default_rng(4)
    centroids = normalise(rng.normal(size=(50, 32)).astype(np.float32))
    rows = normalise(rng.normal(size=(2000, 32)).astype(np.float32))
    rows[:10] = centroids[:10]  # exactly on a centroid
    rows[10] = 0  # a zero row ties everywhere: the first
    exact = rows.astype(np.float64) @ centroids.T.astype(np.float64)
    expected = exact.argmax(axis=1)
    expected[10] = 0
    assert np.array_equal(nearest_centroid(index(centroids), centroids, rows), expected)
    # one centroid: no search needed
    assert nearest_centroid(index(centroids[:1]), centroids[:1], rows).tolist() == [0] * 2000


def test_centroids_that_coincide_are_one_and_distinct_ones_stay() -> None:
    _, centroids = family(0)
    assert len(distinct_centroids(centroids)) == 1
    # a chain of neighbours each under COINCIDE apart is one, whatever its ends' distance
    rng = np.random.default_rng(2)
    start, end = normalise(rng.normal(size=(2, 64)).astype(np.float32))
    step = np.linspace(0, 1, 400, dtype=np.float32)[:, None]
    chain = normalise(start + step * (end - start) * 0.02)
    assert chain[0] @ chain[-1] < 1 - COINCIDE < chain[0] @ chain[1]
    spread = normalise(rng.normal(size=(30, 64)).astype(np.float32))
    # two clusters 0.99 apart (distinct topics can be that close): both stay
    near = normalise(spread[:1] + 0.14 * normalise(rng.normal(size=(1, 64)).astype(np.float32)))
    assert 0.98 < float(near[0] @ spread[0]) < 0.995
    kept = distinct_centroids(np.concatenate([spread, chain, near]))
    assert len(kept) == 30 + 1 + 1
    assert np.array_equal(kept[30], chain[0])  # of a group, the first is kept
