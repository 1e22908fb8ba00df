"""Ready-made stages, grouped by modality (``io`` is shared by every modality; ``minilm`` is
the sentence encoder the text and video stages share)."""
