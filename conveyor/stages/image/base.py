"""What every image stage shares: a stage works on the active images of a part (neither
filtered nor failed), a failure that belongs to one image is recorded on it and the others
go on, and the decoded working copies travel no further than the last stage that reads them.

A stage subclasses ``ImageStage`` and implements ``process_images`` (a model batches a
part's images) or ``process_image``. Errors that belong to the input (bytes that are not an
image) are data, recorded on the image with their reason; anything else is a defect and goes
to the engine, which retries the task and records it as a failure.
"""

from __future__ import annotations

from conveyor.stage import ProcessingStage
from conveyor.tasks.image import ImageBatch, ImageRecord


class BadImage(Exception):
    """The image is bad (its message says how): recorded on it, never retried."""


class ImageStage(ProcessingStage[ImageBatch, ImageBatch]):
    """A stage over the active images of each part."""

    #: drop the working copies once this stage is done (set on the last stage that reads
    #: them by the pipeline builder)
    release_pixels: bool = False

    def process(self, task: ImageBatch) -> ImageBatch:
        active = task.active
        try:
            if active:
                self.process_images(active, task)
        finally:
            if self.release_pixels:
                for image in task.data:
                    image.pixels = None
        return task

    def process_images(self, images: list[ImageRecord], task: ImageBatch) -> None:
        """Process the part's active images; the default runs ``process_image`` on each."""
        for image in images:
            try:
                self.process_image(image)
            except BadImage as exc:
                image.fail(self.name, str(exc) or type(exc).__name__)

    def process_image(self, image: ImageRecord) -> None:
        raise NotImplementedError(f"stage {self.name!r} must implement process_image")

    @staticmethod
    def working_copies(images: list[ImageRecord]) -> list[ImageRecord]:
        """Those of ``images`` that have a decoded working copy (a scoring stage scores
        only these; an image without one failed or was never decoded)."""
        return [image for image in images if image.pixels is not None]
