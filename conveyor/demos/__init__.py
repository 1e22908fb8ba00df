"""Self-checking demos on generated data: ``video`` (the flagship, ``conveyor demo``) and
``text`` (``conveyor text-demo``)."""
