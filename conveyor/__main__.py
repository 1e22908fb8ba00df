"""``python -m conveyor``: the same as the ``conveyor`` command."""

from conveyor.cli import app

if __name__ == "__main__":
    app(prog_name="conveyor")
