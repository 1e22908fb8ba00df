"""``nemo_curator.backends.experimental``: where NeMo Curator's Ray executors lived before
they moved to ``nemo_curator.backends.ray_data`` and ``.ray_actor_pool`` (2026), so that
pipelines written then port by their imports too."""
