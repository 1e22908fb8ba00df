"""What a video may be before it is refused, in a module of its own: the command line reads
the defaults without importing the decoding code."""

from __future__ import annotations

#: the most pixels a video's frame may have by default: DCI 8K (8192 x 4320). A frame of
#: 16,000 x 16,000 (a 120 MB file can hold thirty) took the transcoder's worker to 21 GB
MAX_VIDEO_PIXELS = 8192 * 4320
#: the lowest frame rate taken: a frame every 100 s (a slideshow's few seconds per frame
#: pass); below it the timestamps are broken, and no clip can be cut from its frames
MIN_FPS = 0.01
