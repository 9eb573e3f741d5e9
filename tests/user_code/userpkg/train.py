"""The probe as a module of a user's package: ``python -m userpkg.train OUT ...`` (``torchrun -m``)."""

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).parent.parent / "probe.py"), run_name="__main__")
