"""NeMo Curator's helper modules that ported stages import (``nemo_curator.utils``)."""
