"""Shared test setup: the repository root is importable (fixtures/ holds the generator and goldens)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
