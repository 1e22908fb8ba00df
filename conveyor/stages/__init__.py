"""Ready-made stages, grouped by modality (``io`` is shared by every modality)."""
