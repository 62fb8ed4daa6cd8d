"""Where the checkout is."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
