"""NeMo Curator's ``nemo_curator.core``: ``client.RayClient``."""
