"""Ready-made stages, grouped by modality (``io`` is shared by every modality). The media code
they run (decoding, output layouts, model loading) is in ``conveyor.media``."""
